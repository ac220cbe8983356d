"""The Megatron generation rollout contract from an inference snapshot, and its preview from a recipe."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.contract.contract_preview import absent_sides, predict_rollout
from nemo_rl_attn_align.contract.megatron_generation_contract import ENGINE, megatron_inference_contract
from nemo_rl_attn_align.contract.megatron_snapshot import ContextSnapshot, InferenceSnapshot, ModelConfigSnapshot
from nemo_rl_attn_align.preflight.megatron_generation_facts import resolve_flash_version
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.schema import FIELD_NAMES, Provenance
from tests.conftest import preview_of

MODEL = ModelConfigSnapshot(
    config_class="GPTModelProvider",
    params_dtype="torch.bfloat16",
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=16,
    tensor_model_parallel_size=2,
    batch_invariant_mode=False,
    deterministic_mode=False,
    flash_attention_version=None,
)
CONTEXT = ContextSnapshot(
    block_size_tokens=256,
    max_tokens=16384,
    max_requests=512,
    enable_chunked_prefill=True,
    enable_prefix_caching=False,
    use_flashinfer_fused_rope=True,
    params_dtype="torch.bfloat16",
)


def _values(contract):
    return {name: fv.value for name, fv in contract.fields.items()}


@pytest.mark.parametrize(
    ("pinned", "available", "expected"),
    [
        (None, {"fa4": True, "fa3": True, "fa2": True}, 4),
        (None, {"fa4": False, "fa3": True, "fa2": True}, 3),
        (None, {"fa4": False, "fa3": False, "fa2": True}, 2),
        (3, {"fa4": True, "fa3": True, "fa2": True}, 3),
        (None, {"fa4": False, "fa3": False, "fa2": False}, None),
        (None, {}, None),
    ],
)
def test_flash_version_follows_megatron_cores_resolution(pinned, available, expected):
    assert resolve_flash_version(pinned, available)[0] == expected


def test_a_worker_record_from_an_inference_snapshot():
    snapshot = InferenceSnapshot(MODEL, CONTEXT, {"fa4": False, "fa3": True, "fa2": True})
    values = _values(megatron_inference_contract(snapshot, "megatron-gen-rank0", {"megatron-core": "0.19.2"}))
    assert values["engine"] == ENGINE and values["backend"] == "flash_attn_3"
    assert (values["kv_page_size"], values["chunked_prefill_chunk"], values["physical_batch"]) == (256, 16384, 512)
    assert (values["dtype"], values["kv_cache_dtype"], values["tp_size"], values["cp_size"]) == ("bf16", "bf16", 2, 1)
    assert (values["split_kv_policy"], values["reduction_engine"]) == ("heuristic", "fa_split_combine")
    assert values["mode"] == "chunked_prefill+decode" and values["rope_fusion"] is True


def test_an_unread_engine_gives_a_whole_contract_with_reasons():
    contract = megatron_inference_contract(InferenceSnapshot(), "megatron-gen-rank0")
    assert set(contract.fields) == set(FIELD_NAMES)
    assert contract.fields["split_kv_policy"].provenance == Provenance.UNOBSERVABLE
    assert "batch_invariant_mode is not known" in contract.fields["split_kv_policy"].source
    assert contract.fields["backend"].provenance == Provenance.UNOBSERVABLE


def _recipe(**generation):
    return {
        "policy": {
            "model_name": "nowhere/none",
            "precision": "bfloat16",
            "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2, "context_parallel_size": 1},
            "generation": {"backend": "megatron", "colocated": {"enabled": True}, **generation},
        }
    }


def test_the_preview_binds_megatron_generation():
    recipe = _recipe(
        mcore_generation_config={"block_size_tokens": 128, "max_tokens": 4096, "enable_chunked_prefill": False}
    )
    assert absent_sides(read_recipe_facts(recipe)) == {}
    values = _values(predict_rollout(read_recipe_facts(recipe, {}), environ={}))
    assert values["engine"] == ENGINE
    assert (values["kv_page_size"], values["chunked_prefill_chunk"], values["mode"]) == (128, None, "prefill+decode")
    assert values["tp_size"] == 2 and values["kv_cache_dtype"] == "bf16"
    assert preview_of(recipe).binding is not None


def test_the_generation_model_of_a_non_colocated_recipe_is_the_merge():
    recipe = _recipe(colocated={"enabled": False}, mcore_generation_config={"tensor_model_parallel_size": 1})
    rollout = predict_rollout(read_recipe_facts(recipe, {}), environ={})
    assert rollout.fields["tp_size"].value == 1
    assert "merged with policy.generation.mcore_generation_config" in rollout.fields["tp_size"].source


@pytest.mark.parametrize("backend", ["sglang", "dynamo", "trtllm"])
def test_other_rollout_backends_are_absent_with_the_reason(backend):
    recipe = _recipe()
    recipe["policy"]["generation"]["backend"] = backend
    assert predict_rollout(read_recipe_facts(recipe, {}), environ={}) is None
    assert f"policy.generation.backend {backend!r}" in absent_sides(read_recipe_facts(recipe))["rollout"]
