"""Megatron generation as a rollout side, on NeMo-RL 7ea279a's own sources and megatron-core 0.19.2.

``megatron_generation_probe.py`` runs NeMo-RL's ``MegatronGenerationMixin._initialize_inference_engine``
in a process of its own with the plugin active (what it replaces on CPU is listed there: no
attention kernel runs, the context, config and wrapper are megatron-core's own). The tests judge the
rollout records the hook wrote, compare them with ``check``'s preview of the same settings, and
compare the plugin's reading of every shipped Megatron-generation recipe with NeMo-RL's own
``merged_inference_megatron_cfg`` / ``dedicated_inference_megatron_cfg``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.contract_preview import predict_rollout
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.schema import FIELD_NAMES, Provenance
from tests.conftest import preview_of

from .conftest import snapshot
from .megatron_generation_probe import CASES, ENGINE_CFG

pytestmark = pytest.mark.real_nemo_rl

REPO = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).parent / "stand_ins"
RECIPE = "examples/configs/recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml"
RECORD = "workers/rollout--megatron-gen-rank0.json"
_probes: dict[str, dict] = {}


def _probe(case: str, tmp_path_factory) -> dict:
    """The probe's output for ``case`` (both cases start together, on first use)."""
    if case not in _probes:
        tree = snapshot("7ea279a")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(STAND_INS), str(tree)])}
        env.pop("NEMO_RL_ATTN_ALIGN_REPORT_DIR", None)
        running = {}
        for name in CASES:
            out = tmp_path_factory.mktemp(f"megatron-generation-{name}") / "probe.json"
            cmd = [sys.executable, "-m", "tests.real_nemo_rl.megatron_generation_probe", str(tree), str(out), name]
            running[name] = (subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True), out)
        for name, (proc, out) in running.items():
            _, stderr = proc.communicate(timeout=900)
            assert proc.returncode == 0, stderr[-4000:]
            _probes[name] = json.loads(out.read_text())
    return _probes[case]


def _fields(probe: dict) -> dict:
    engine = probe["engine"]
    assert "error" not in engine, engine["error"]
    assert set(engine["records"]) == {RECORD, "hosts/rollout--megatron-gen-rank0.json"}
    return engine["records"][RECORD]["contract"]["fields"]


def _values(fields: dict) -> dict:
    return {name: field["value"] for name, field in fields.items()}


def test_the_real_engine_init_writes_one_rollout_record(tmp_path_factory):
    probe = _probe("default", tmp_path_factory)
    engine = probe["engine"]
    assert engine["context_class"] == "megatron.core.inference.contexts.dynamic_context.DynamicInferenceContext"
    assert engine["wrapper_class"] == "GPTInferenceWrapper"
    fields = _fields(probe)
    assert set(fields) == set(FIELD_NAMES)
    values = _values(fields)
    assert values["engine"] == "megatron-inference"
    assert values["kv_page_size"] == ENGINE_CFG["block_size_tokens"]
    assert values["chunked_prefill_chunk"] == ENGINE_CFG["max_tokens"]
    assert values["physical_batch"] == ENGINE_CFG["max_requests"]
    assert values["prefix_caching"] is ENGINE_CFG["enable_prefix_caching"]
    assert values["mode"] == "chunked_prefill+decode"
    assert values["dtype"] == values["kv_cache_dtype"] == "bf16"
    assert values["rope_fusion"] is True  # NeMo-RL asks for flashinfer's fused RoPE in bf16
    assert (values["num_layers"], values["num_attention_heads"], values["num_query_groups"]) == (2, 4, 2)
    assert (values["split_kv_policy"], values["reduction_order"]) == ("heuristic", "split_kv")
    assert values["batch_invariant"] is False and values["cp_size"] == 1
    # No flash-attn on this machine: megatron-core would stop at the first step; the record says so.
    assert fields["flash_attention_version"]["provenance"] == Provenance.UNOBSERVABLE.value
    assert "no flash-attn is installed" in fields["backend"]["source"]
    detail = engine["records"]["hosts/rollout--megatron-gen-rank0.json"]
    assert detail["host"] == "megatron_generation" and detail["stage"] == "engine_ready"


def test_batch_invariant_mode_is_recorded_as_one_kv_split(tmp_path_factory):
    values = _values(_fields(_probe("batch_invariant", tmp_path_factory)))
    assert (values["backend"], values["flash_attention_version"]) == ("flash_attn_3", 3)
    assert (values["split_kv_policy"], values["reduction_order"], values["reduction_engine"]) == (
        "fixed_count:1",
        "kv_index",
        "single_kernel",
    )
    assert values["batch_invariant"] is True


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_preview_predicts_what_the_engine_records(case, tmp_path_factory):
    recorded = _values(_fields(_probe(case, tmp_path_factory)))
    overrides = {k: v for k, v in CASES[case].items() if k != "attention_backend"}
    cfg = {
        "policy": {
            "precision": "bfloat16",
            "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 1, "model_overrides": overrides},
            "generation": {
                "backend": "megatron",
                "colocated": {"enabled": True},
                "mcore_generation_config": ENGINE_CFG,
            },
        }
    }
    predicted = predict_rollout(read_recipe_facts(cfg, {}), environ={})
    configured = {name: fv.value for name, fv in predicted.fields.items() if fv.provenance == Provenance.CONFIGURED}
    assert len(configured) >= 20
    differ = {name: (value, recorded[name]) for name, value in configured.items() if recorded[name] != value}
    assert differ == {}


def test_the_plugin_reads_every_megatron_generation_recipe_as_nemo_rl_does(tmp_path_factory):
    recipes = _probe("default", tmp_path_factory)["recipes"]
    loaded = {name: r for name, r in recipes.items() if "load_error" not in r}
    # every recipe loads (the snapshot holds the NeMo-Gym configs async-gym's defaults chain names)
    assert {name: r["load_error"] for name, r in recipes.items() if name not in loaded} == {}
    assert len(loaded) == 7
    for name, r in loaded.items():
        assert r["plugin_colocated"] == r["colocated"], name
        assert r["plugin_dedicated"] == r["host_dedicated"], name
        assert r["plugin_tp"] == r["host_layout"]["tensor_model_parallel_size"], name
        assert r["plugin_impl"] == (r["host_impl"] or "transformer_engine"), name
        assert r["training_worker_generation_only"] is False, name
        if not r["colocated"]:
            assert r["generation_only_worker"] is True, name


def test_check_binds_a_shipped_megatron_generation_recipe():
    tree = snapshot("7ea279a")
    preview = preview_of(load_config(tree / RECIPE))
    assert preview.rollout is not None and preview.binding is not None
    assert preview.rollout.fields["engine"].value == "megatron-inference"
    assert preview.rollout.fields["kv_page_size"].value == 256  # grpo_math_1B.yaml's block_size_tokens
    assert not any("no rollout contract" in note for note in preview.notes)
    aligned = preview_of(
        load_config(
            tree / RECIPE,
            [
                "++policy.megatron_cfg.attention_backend=flash",
                "++policy.megatron_cfg.model_overrides.batch_invariant_mode=true",
                "++policy.megatron_cfg.model_overrides.flash_attention_version=3",
                "++policy.megatron_cfg.model_overrides.attention_dropout=0.0",
            ],
        ),
        environ={},
    )
    semantic = aligned.binding.to_dict()
    assert aligned.rollout.fields["reduction_order"].value == aligned.training.fields["reduction_order"].value
    assert "reduction_order" not in json.dumps([f for f in semantic["findings"] if f["severity"] == "error"])


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"flash_attention_version": 2, "attention_dropout": 0.0}, "BATCH_INVARIANT_REQUIRES_FLASH_VERSION"),
        ({"flash_attention_version": 3, "attention_dropout": 0.1}, "BATCH_INVARIANT_NO_ATTENTION_DROPOUT"),
    ],
)
def test_batch_invariant_rules_say_what_megatron_core_asserts(overrides, code):
    snapshot("7ea279a")  # the lane's megatron-core (0.19.2) is the one NeMo-RL main runs
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    from nemo_rl_attn_align.preflight.facts import read_policy_facts
    from nemo_rl_attn_align.preflight.rules import evaluate

    with pytest.raises(AssertionError) as host:
        TransformerConfig(
            num_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            attention_backend=AttnBackend.flash,
            batch_invariant_mode=True,
            **overrides,
        )
    policy = {
        "precision": "bfloat16",
        "megatron_cfg": {
            "enabled": True,
            "attention_backend": "flash",
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "context_parallel_size": 1,
            "model_overrides": {"batch_invariant_mode": True, **overrides},
        },
    }
    [found] = evaluate(read_policy_facts(policy, {}))
    assert found.code.value == code
    assert str(host.value).split(" (got")[0] in found.message


def test_the_shipped_sglang_recipe_is_reported_as_not_bound():
    tree = snapshot("7ea279a")
    from nemo_rl_attn_align.hosts.driver_report import absent_sides
    from nemo_rl_attn_align.vocab.schema import NotBound

    cfg = load_config(tree / "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1-sglang.yaml")
    why = absent_sides(cfg, read_recipe_facts(cfg), "grpo")["rollout"]
    assert isinstance(why, NotBound)
    assert why.startswith("policy.generation.backend 'sglang': its workers record nothing")
    assert "8 generation GPUs" in why
