"""``policy.generation.backend: megatron``: the generation model as NeMo-RL builds it."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.hosts.megatron_generation import is_generation_only
from nemo_rl_attn_align.preflight.expected_workers import expected_workers
from nemo_rl_attn_align.preflight.megatron_generation_facts import read_megatron_generation_facts

TRAIN = {"tensor_model_parallel_size": 4, "context_parallel_size": 2, "enabled": True}


def _policy(colocated=True, **engine):
    return {
        "precision": "bfloat16",
        "megatron_cfg": dict(TRAIN),
        "generation": {"backend": "megatron", "colocated": {"enabled": colocated}, "mcore_generation_config": engine},
    }


def test_not_megatron_generation_gives_none():
    assert read_megatron_generation_facts({"generation": {"backend": "vllm"}}) is None
    assert read_megatron_generation_facts("not a mapping") is None


def test_colocated_training_with_cp_builds_a_dedicated_model_with_cp_1():
    facts = read_megatron_generation_facts(_policy())
    assert facts.colocated and facts.dedicated
    assert facts.model.context_parallel_size == 1 and facts.model.tensor_parallel_size.value == 4


def test_colocated_with_the_same_layout_generates_on_the_training_model():
    policy = _policy(tensor_model_parallel_size=4)
    policy["megatron_cfg"]["context_parallel_size"] = 1
    facts = read_megatron_generation_facts(policy)
    assert not facts.dedicated and facts.overridden == ()
    assert facts.model_key == "policy.megatron_cfg (the training model)"


def test_not_colocated_merges_the_engine_config():
    facts = read_megatron_generation_facts(_policy(colocated=False, tensor_model_parallel_size=1, block_size_tokens=64))
    assert facts.dedicated and facts.model.tensor_parallel_size.value == 1
    assert facts.overridden == ("tensor_model_parallel_size",)
    assert facts.block_size_tokens.value == 64


@pytest.mark.parametrize(
    ("megatron_cfg", "expected"),
    [({"buffer_size_gb": 1, "block_size_tokens": 256, "kv_cache_management_mode": "persist"}, True), ({}, False)],
)
def test_a_dedicated_inference_worker_is_known_by_its_merged_keys(megatron_cfg, expected):
    policy = {"generation": {"backend": "megatron"}, "megatron_cfg": megatron_cfg}
    assert is_generation_only(policy) is expected
    assert is_generation_only({**policy, "generation": {"backend": "vllm"}}) is False


def test_expected_rollout_workers_are_one_engine_per_policy_worker():
    cfg = {"cluster": {"num_nodes": 1, "gpus_per_node": 4}, "policy": _policy()}
    rollout = expected_workers(cfg)["rollout"]
    assert rollout.count == 4
    assert rollout.ids == tuple(f"megatron-gen-rank{r}" for r in range(4))
