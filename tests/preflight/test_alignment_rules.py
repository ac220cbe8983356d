"""Batch-invariant and Megatron-generation rules (``preflight/rules/alignment.py``)."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.preflight.facts import read_policy_facts
from nemo_rl_attn_align.preflight.rules import evaluate
from nemo_rl_attn_align.vocab.codes import Code

INVARIANT = {"batch_invariant_mode": True, "flash_attention_version": 3, "attention_dropout": 0.0}


def _policy(overrides=None, generation=None):
    return {
        "precision": "bfloat16",
        "megatron_cfg": {
            "enabled": True,
            "attention_backend": "flash",
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "context_parallel_size": 1,
            "model_overrides": dict(INVARIANT if overrides is None else overrides),
        },
        "generation": generation or {"backend": "vllm"},
    }


def _codes(policy):
    return [f.code for f in evaluate(read_policy_facts(policy, {}))]


def test_a_batch_invariant_policy_as_megatron_core_wants_it_passes():
    assert _codes(_policy()) == []


@pytest.mark.parametrize("version", [None, 2, True, "3"])
def test_batch_invariance_needs_flash_attention_3_or_4(version):
    overrides = {**INVARIANT, "flash_attention_version": version}
    [found] = [f for f in evaluate(read_policy_facts(_policy(overrides), {}))]
    assert found.code is Code.BATCH_INVARIANT_REQUIRES_FLASH_VERSION
    assert found.key == "policy.megatron_cfg.model_overrides.flash_attention_version"
    assert "--flash-attention-version 3 or 4" in found.message


def test_batch_invariance_refuses_attention_dropout():
    assert _codes(_policy({**INVARIANT, "attention_dropout": 0.1})) == [Code.BATCH_INVARIANT_NO_ATTENTION_DROPOUT]


def test_without_batch_invariance_nothing_is_required():
    assert _codes(_policy({"flash_attention_version": 2, "attention_dropout": 0.1})) == []


def _megatron_generation(colocated, engine):
    return {"backend": "megatron", "colocated": {"enabled": colocated}, "mcore_generation_config": engine}


def test_a_generation_model_with_other_attention_settings_warns():
    engine = {"model_overrides": {**INVARIANT, "batch_invariant_mode": False}}
    [found] = evaluate(read_policy_facts(_policy(generation=_megatron_generation(False, engine)), {}))
    assert found.code is Code.GENERATION_ATTENTION_DIFFERS and found.severity.value == "warning"
    assert found.key == "policy.generation.mcore_generation_config.model_overrides.batch_invariant_mode"


def test_colocated_on_the_training_model_the_engine_overrides_do_not_apply():
    engine = {"model_overrides": {}}  # same layout: NeMo-RL generates on the training model
    assert _codes(_policy(generation=_megatron_generation(True, engine))) == []


@pytest.mark.parametrize("key", ["attention_backend", "transformer_impl"])
def test_settings_the_inference_attention_ignores_do_not_warn(key):
    engine = {key: "inference_optimized" if key == "transformer_impl" else "fused", "sequence_parallel": True}
    assert _codes(_policy(generation=_megatron_generation(False, engine))) == []
