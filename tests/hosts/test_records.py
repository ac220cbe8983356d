"""The workers' contract builders (``contract.training``, ``contract.rollout``) on their own: whole contracts
from any facts, the flash-attn version TE reports, one semantics rule shared with ``check``'s
preview, the values the schema lists, version look-ups, and what importing them pulls in."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.contract.contract_preview import predict_training
from nemo_rl_attn_align.contract.megatron_snapshot import ModelConfigSnapshot
from nemo_rl_attn_align.contract.rollout import rollout_contract
from nemo_rl_attn_align.contract.semantics import VLLM_ONLINE_SOFTMAX_BACKENDS
from nemo_rl_attn_align.contract.training import training_contract
from nemo_rl_attn_align.contract.vllm_snapshot import VllmSnapshot
from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, CP_COMM_TYPES
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab.schema import FIELD_NAMES, Tier, fields_of
from tests.fake_nemo_rl.configs import policy_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"
#: Recorded fields that follow from the same facts as the semantic tier.
DERIVED = (
    *fields_of(Tier.SEMANTIC),
    "reduction_engine",
    "split_kv_policy",
    "kv_page_size",
    "kv_cache_dtype",
    "chunked_prefill_chunk",
    "prefix_caching",
)


def test_an_unread_model_config_gives_a_whole_contract():
    """A failed model-config record leaves the worker with no snapshot: its contract says unobservable."""
    contract = training_contract(None, "policy-rank0")
    assert list(contract.fields) == list(FIELD_NAMES)
    for name in ("num_layers", "sliding_window", "batch_invariant", "deterministic", "backend", "merge_rule"):
        assert contract[name].provenance.value == "unobservable", name
    assert all(fv.provenance.value != "pending" for _, fv in contract)  # pending is for previews only


@pytest.mark.parametrize(
    "observed, value, provenance",
    [
        (
            {
                "status": "observed",
                "backend": "FlashAttention",
                "engine": "megatron-te",
                "source": "TE",
                "flash_attention_version": 3,
                "detail": "flash-attn 3.0.0b1",
            },
            3,
            "observed",
        ),
        (
            {
                "status": "observed",
                "backend": "FusedAttention",
                "engine": "megatron-te",
                "source": "TE",
                "detail": "sub-backend 1",
            },
            None,
            "observed",
        ),
        (
            {"status": "observed", "backend": "local", "engine": "megatron-local", "source": "core_attention"},
            None,
            "observed",
        ),
        (
            {"status": "observed", "backend": "FlashAttention", "engine": "megatron-te", "source": "NVTE_DEBUG log"},
            None,
            "unobservable",
        ),
        (
            {"status": "unobservable", "backend": None, "engine": "megatron-te", "source": "no selection"},
            None,
            "unobservable",
        ),
        (None, None, "unobservable"),
    ],
)
def test_flash_attention_version_is_what_te_reports(observed, value, provenance):
    snapshot = ModelConfigSnapshot(
        attention_backend="flash", params_dtype="bfloat16", absent=("flash_attention_version",)
    )
    field = training_contract(snapshot, "policy-rank0", observed)["flash_attention_version"]
    assert (field.value, field.provenance.value) == (value, provenance), field.source


@pytest.mark.parametrize(
    "backend, precision, cp, comm",
    [
        ("flash", "bfloat16", 1, "p2p"),
        ("flash", "bfloat16", 2, "p2p"),
        ("flash", "bfloat16", 2, "a2a+p2p"),
        ("fused", "bfloat16", 2, "all_gather"),
        ("fused", "float16", 2, "a2a"),
        ("unfused", "bfloat16", 2, "p2p"),
        ("auto", "float32", 1, "p2p"),
        ("auto", "bfloat16", 2, "a2a+p2p"),
    ],
)
def test_the_training_record_derives_what_check_previews(backend, precision, cp, comm):
    """One rule (``semantics.te_semantics``): the same semantic tier, reduction_engine, split-KV and KV-cache fields."""
    policy = policy_config(backend, precision=precision, impl="transformer_engine")
    policy["megatron_cfg"].update(context_parallel_size=cp, model_overrides={"cp_comm_type": comm})
    predicted = predict_training(read_recipe_facts({"policy": policy}, {}))
    snapshot = ModelConfigSnapshot(
        attention_backend=backend, params_dtype=precision, context_parallel_size=cp, cp_comm_type=comm
    )
    recorded = training_contract(snapshot, "policy-rank0")
    assert {n: recorded.value(n) for n in DERIVED} == {n: predicted.value(n) for n in DERIVED}
    assert {n: predicted[n].provenance.value for n in DERIVED} == {n: "configured" for n in DERIVED}
    assert {n: recorded[n].provenance.value for n in DERIVED} == {
        n: "observed" if n == "dtype" else "configured" for n in DERIVED
    }


def _written(contracts, name):
    return {c.value(name) for c in contracts if c[name].provenance.value == "configured"}


def _every_worker_contract():
    for backend, dtype, cp, comm in itertools.product(BACKEND_NAMES, ("bf16", "fp32"), (1, 2), CP_COMM_TYPES):
        snapshot = ModelConfigSnapshot(
            attention_backend=backend, params_dtype=dtype, context_parallel_size=cp, cp_comm_type=comm
        )
        yield training_contract(snapshot, "policy-rank0")
    for backend, invariant in itertools.product((*VLLM_ONLINE_SOFTMAX_BACKENDS, "SOME_NEW_BACKEND"), (False, True)):
        yield rollout_contract(
            VllmSnapshot(layer_backends={"layer.0": backend}, batch_invariant=invariant), "vllm-rank0-worker0"
        )


def _documented(name):
    [row] = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| recorded | `{name}` |")]
    return set(re.findall(r"`([a-z0-9_:+]+)`", row.split("|")[3])) - {"cp_comm_type"}


@pytest.mark.parametrize("name", ["reduction_engine", "split_kv_policy"])
def test_the_schema_lists_exactly_the_values_workers_write(name):
    assert _written(list(_every_worker_contract()), name) == _documented(name)


def test_library_versions_are_looked_up_once_per_process(monkeypatch):
    from importlib import metadata

    looked_up = []
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: looked_up.append(name) or real(name))
    versions.distribution_version.cache_clear()
    try:
        names = ("pytest", "no-such-distribution-here")
        first, second = versions.library_versions(names), versions.library_versions(names)
    finally:
        versions.distribution_version.cache_clear()
    assert first == second == {"pytest": pytest.__version__}
    assert looked_up == list(names)


def test_the_record_modules_import_no_config_path_module():
    """The read-back and the record builders need the semantics rules and the backend names only,
    never the ``check`` path (preview, plan, rules, config, settings, binding, determinism)."""
    code = (
        "import sys\n"
        "from nemo_rl_attn_align.contract import megatron_snapshot, rollout, training\n"
        "from nemo_rl_attn_align.hosts import te_readback\n"
        "te_readback.mismatch('flash', {'status': 'observed', 'backend': 'FusedAttention'})\n"
        "snapshot = megatron_snapshot.ModelConfigSnapshot(attention_backend='flash', params_dtype='bf16')\n"
        "training.training_contract(snapshot, 'w')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('nemo_rl_attn_align'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = set(out.stdout.split())
    assert "nemo_rl_attn_align.contract.semantics" in loaded
    check_path = {
        "contract.contract_preview",
        "preflight.plan",
        "preflight.rules",
        "config.loader",
        "config.settings",
        "binding.binding",
        "binding.determinism",
    }
    assert loaded.isdisjoint(f"nemo_rl_attn_align.{name}" for name in check_path), loaded
