"""The Megatron worker hook through NeMo-RL's seams, with a real megatron-core GPTModel on CPU.

``tests/fake_nemo_rl`` holds stand-ins laid out like NeMo-RL >= 0.6 and 0.5.x (module paths, names
and signatures as upstream; NeMo-RL is not on PyPI). They build a tiny real GPTModel with the local
layer spec, so Megatron's own ``_set_attention_backend`` sets the NVTE variables and the local
``DotProductAttention`` runs the forward. ``import megatron.core`` costs seconds: one module, shared.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys

import pytest

pytest.importorskip("megatron.core")

from nemo_rl_attn_align.contract.contract_preview import predict_training
from nemo_rl_attn_align.hosts import hooks, megatron_worker
from nemo_rl_attn_align.hosts.seams import HOOKS
from nemo_rl_attn_align.preflight.backend import NVTE_VARIABLES
from nemo_rl_attn_align.preflight.plan import build_plan_for_policy
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.report.store import read_worker_files
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.errors import RuleViolation
from tests.fake_nemo_rl.configs import policy_config
from tests.hosts.conftest import MEGATRON_WORKER as WORKER
from tests.hosts.conftest import standin


def detail(tmp_path):
    return json.loads((tmp_path / "report" / "hosts" / "training--policy-rank0.json").read_text())


def contract_of(tmp_path):
    files = read_worker_files(tmp_path / "report")
    assert files.unreadable == () and files.incomplete_writes == ()
    [record] = files.records
    return record.contract, record.probe


def test_v06_records_the_finished_config_and_nvte_match_the_plan(hooked, tmp_path):
    worker_module = hooked("v0_6")
    assert megatron_worker.record.layout == "setup-module"
    cfg = policy_config("local")
    worker = worker_module.MegatronPolicyWorker(cfg)
    plan = build_plan_for_policy(cfg, os.environ)
    assert {k: os.environ.get(k) for k in NVTE_VARIABLES} == plan.nvte == {k: "0" for k in NVTE_VARIABLES}
    assert detail(tmp_path)["stage"] == "model_built"  # nothing read back before the first forward
    contract, _ = contract_of(tmp_path)
    assert contract["backend"].provenance.value == "unobservable" and contract.value("backend") == "local"

    worker.get_logprobs()
    model_cfg = worker.megatron_cfg.model
    contract, probe = contract_of(tmp_path)
    expected = {
        "num_layers": model_cfg.num_layers,
        "num_attention_heads": model_cfg.num_attention_heads,
        "num_query_groups": model_cfg.num_query_groups,
        "head_dim": model_cfg.kv_channels,
        "softmax_scale": 1 / math.sqrt(model_cfg.kv_channels),
        "dtype": "bf16",
        "tp_size": model_cfg.tensor_model_parallel_size,
        "cp_size": model_cfg.context_parallel_size,
        "rope_fusion": model_cfg.apply_rope_fusion,
        "deterministic": model_cfg.deterministic_mode,
        "batch_invariant": model_cfg.batch_invariant_mode,
        "vocab_size": model_cfg.vocab_size,
        "rope_parameters": {"theta": model_cfg.rotary_base, "partial_rotary_factor": model_cfg.rotary_percent},
        "backend": "local",
        "engine": "megatron-local",
        "physical_batch": cfg["logprob_batch_size"],
    }
    assert {name: contract.value(name) for name in expected} == expected
    assert contract["backend"].provenance.value == "observed"
    assert probe is not None and probe.torch_status == "probed"
    predicted = predict_training(read_recipe_facts({"policy": cfg}))  # what `check` previews for the same config
    semantic = ("merge_rule", "reduction_order", "acc_dtype", "downcast", "dtype")
    assert {n: contract.value(n) for n in semantic} == {n: predicted.value(n) for n in semantic}
    seen = detail(tmp_path)
    assert seen["stage"] == "first_forward" and seen["backend_mapped_by"] == "nemo_rl" and seen["findings"] == []
    assert seen["model_config"]["attention_backend"] == model_cfg.attention_backend.name == "local"
    assert seen["nvte_after_build"] == plan.nvte


def test_a_failed_model_config_record_still_reads_back_the_backend(hooked, tmp_path, monkeypatch, caplog):
    """One failed step (a warning) does not skip the later ones: the built model and TE's choice are recorded."""
    from nemo_rl_attn_align.contract import megatron_snapshot

    def unreadable(model_cfg, policy_cfg=None):
        raise AttributeError("this Megatron-Bridge provider hides its fields")

    monkeypatch.setattr(megatron_snapshot, "read_model_config", unreadable)
    worker_module = hooked("v0_6")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        worker = worker_module.MegatronPolicyWorker(policy_config("local"))
        worker.get_logprobs()
    assert any("recording the model config failed" in r.getMessage() for r in caplog.records)
    assert detail(tmp_path)["stage"] == "first_forward" and detail(tmp_path)["model_config"] is None
    contract, _ = contract_of(tmp_path)
    assert contract.value("backend") == "local" and contract["backend"].provenance.value == "observed"
    assert contract["num_layers"].provenance.value == "unobservable"  # not guessed


def test_the_built_models_behaviour_is_in_the_record_written_at_model_built(hooked, tmp_path):
    """rope, mask and softmax read from the live model (hosts.megatron_behaviour) before any forward."""
    worker_module = hooked("v0_6")
    cfg = policy_config("local", standin_model={"window_size": (7, 0), "window_attn_skip_freq": 2})
    worker_module.MegatronPolicyWorker(cfg)
    assert detail(tmp_path)["stage"] == "model_built"
    contract, _ = contract_of(tmp_path)
    assert {contract[f].provenance.value for f in ("rope", "mask", "softmax")} == {"observed"}
    assert contract.value("mask")["layers"] == [[0, 0], [1, 1]]  # layer_number 1 windowed, 2 full
    assert contract.value("mask")["kinds"] == [{"causal": True, "window": 7}, {"causal": True, "window": None}]
    head_dim = 64 // 4
    [rope] = contract.value("rope")["kinds"]
    assert rope["pairs"] == [[i, i + head_dim // 2] for i in range(head_dim // 2)]
    assert contract.value("softmax")["kinds"] == [{"scale": 0.25, "softcap": None, "sinks": "none"}]
    assert "DotProductAttention.scale_mask_softmax.window_size" in contract["mask"].source


def test_a_failed_behaviour_read_is_a_finding_and_the_field_unobservable(hooked, tmp_path, monkeypatch, caplog):
    from nemo_rl_attn_align.hosts import megatron_behaviour

    def broken(index):
        def read(layer):
            raise RuntimeError("a module this reader did not expect")

        return read

    monkeypatch.setattr(megatron_behaviour, "_core_reader", broken)
    worker_module = hooked("v0_6")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        worker_module.MegatronPolicyWorker(policy_config("local")).get_logprobs()
    contract, _ = contract_of(tmp_path)
    why = "reading the mask behaviour failed: RuntimeError: a module this reader did not expect"
    assert contract["mask"].provenance.value == "unobservable" and contract["mask"].source == why
    assert contract["rope"].provenance.value == "observed"
    assert why in detail(tmp_path)["findings"] and any(why in r.getMessage() for r in caplog.records)
    assert detail(tmp_path)["stage"] == "first_forward"  # the worker went on


def test_v06_before_1628_gets_the_mapping_from_the_plugin(hooked, tmp_path):
    hooked("v0_6")
    setup = sys.modules["nemo_rl.models.megatron.setup"]
    setup.HAS_ATTENTION_BACKEND = False
    worker = sys.modules[WORKER].MegatronPolicyWorker(policy_config("local"))
    from megatron.core.transformer.enums import AttnBackend

    assert worker.megatron_cfg.model.attention_backend is AttnBackend.local
    assert detail(tmp_path)["backend_mapped_by"] == "nemo_rl_attn_align"
    assert os.environ["NVTE_FLASH_ATTN"] == "0"


def test_flash_fp32_stops_at_the_seam_before_any_model(hooked, tmp_path):
    worker_module = hooked("v0_6")
    with pytest.raises(RuleViolation) as err:
        worker_module.MegatronPolicyWorker(policy_config("flash", precision="float32", impl="transformer_engine"))
    assert [f.code for f in err.value.findings] == ["FLASH_REQUIRES_HALF_PRECISION"]
    assert not (tmp_path / "report").exists()  # stopped before the model config was even finished
    assert all(name not in os.environ for name in NVTE_VARIABLES)  # no model was built


def test_readback_differs_from_request_warns_or_stops_in_strict(hooked, tmp_path, monkeypatch, caplog):
    worker_module = hooked("v0_6")
    worker = worker_module.MegatronPolicyWorker(policy_config("flash", impl="local"))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        worker.get_logprobs()
    problem = "attention_backend requested AttnBackend.flash (FlashAttention) but the model ran local"
    assert any(problem in r.getMessage() for r in caplog.records)
    assert problem in detail(tmp_path)["findings"][0]
    assert os.environ["NVTE_FLASH_ATTN"] == "1"  # Megatron set what was asked; the local spec ignores it

    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    monkeypatch.setattr(megatron_worker, "record", megatron_worker.TrainingRecord())
    for name in NVTE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    strict_worker = worker_module.MegatronPolicyWorker(policy_config("flash", impl="local"))
    with pytest.raises(_patching.StrictModeError, match=re.escape("attention_align.strict is true")):
        strict_worker.get_logprobs()
    assert detail(tmp_path)["stage"] == "first_forward"  # written before stopping


def test_v05_layout_gets_the_mapping_from_the_plugin(hooked, tmp_path):
    worker_module = hooked("v0_5")
    assert megatron_worker.record.layout == "worker-inline"
    worker = worker_module.MegatronPolicyWorker(policy_config("local"))
    worker.get_logprobs()
    from megatron.core.transformer.enums import AttnBackend

    assert worker.megatron_cfg.model.attention_backend is AttnBackend.local
    seen = detail(tmp_path)
    assert seen["layout"] == "worker-inline" and seen["nemo_rl"] == "0.5.0"
    assert seen["backend_mapped_by"].startswith("nemo_rl_attn_align")
    assert seen["nvte_after_build"] == {k: "0" for k in NVTE_VARIABLES}
    contract, _ = contract_of(tmp_path)
    assert contract.value("backend") == "local" and contract.value("num_layers") == worker.megatron_cfg.model.num_layers


def test_unknown_layout_warns_once_and_strict_stops(bootstrap_state, tmp_path, monkeypatch, caplog):
    root = tmp_path / "nemo_rl_future"
    pkg = root / "nemo_rl" / "models" / "policy" / "workers"
    pkg.mkdir(parents=True)
    (root / "nemo_rl" / "__init__.py").write_text("__version__ = '9.0.0'\n")
    for sub in (root / "nemo_rl" / "models", root / "nemo_rl" / "models" / "policy", pkg):
        (sub / "__init__.py").write_text("")
    (pkg / "megatron_policy_worker.py").write_text("def build_everything(policy_cfg):\n    return policy_cfg\n")
    monkeypatch.setattr(hooks, "_warned", set())
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    with standin(root, "nemo_rl"), caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        module = __import__(WORKER, fromlist=["build_everything"])
        assert module.build_everything({"x": 1}) == {"x": 1}  # untouched
    lines = [r.getMessage() for r in caplog.records if "not found" in r.getMessage()]
    assert len(lines) == 1 and "NeMo-RL 9.0.0" in lines[0]
    assert (
        "setup-module layout (NeMo-RL >=0.6.0)" in lines[0] and "setup_megatron_model(policy_cfg, cfg, ...)" in lines[0]
    )

    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    with standin(root, "nemo_rl"), pytest.raises(_patching.HostLayoutError, match=re.escape("NeMo-RL 9.0.0")):
        __import__(WORKER)
    megatron_worker.detach()


@pytest.mark.nemo_rl
def test_real_nemo_rl_has_a_known_layout(bootstrap_state):
    pytest.importorskip("nemo_rl", reason="NeMo-RL is not installed here (it is not on PyPI)")
    try:
        __import__(WORKER)
    except ImportError as err:  # needs megatron.bridge, TE, CUDA: GPU nodes
        pytest.skip(f"{WORKER} does not import here: {err}")
    megatron_worker.attach()
    assert megatron_worker.record.layout in HOOKS["megatron_worker"].layouts
