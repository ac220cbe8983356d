"""How many workers each side should start, from real configs loaded by the real OmegaConf/Hydra loader."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.hosts.driver_report import absent_sides
from nemo_rl_attn_align.preflight.expected_workers import expected_workers
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from tests.conftest import EXAMPLES

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"


def counts(path, overrides, algorithm="grpo"):
    cfg = load_config(path, overrides)
    expected = expected_workers(cfg, absent_sides(cfg, read_recipe_facts(cfg), algorithm))
    return {side: e.count for side, e in expected.items()}, expected


@pytest.mark.parametrize(
    "overrides, training, rollout",
    [
        ([], 1, 1),  # the example: one GPU, colocated
        (
            [
                "cluster.num_nodes=2",
                "cluster.gpus_per_node=4",
                "policy.megatron_cfg.tensor_model_parallel_size=2",
                "policy.megatron_cfg.context_parallel_size=2",
                "policy.generation.vllm_cfg.tensor_parallel_size=2",
            ],
            8,
            8,
        ),
        (
            [
                "cluster.gpus_per_node=8",
                "policy.generation.colocated.enabled=false",
                "policy.generation.colocated.resources.gpus_per_node=2",
            ],
            6,
            2,
        ),  # one node: generation takes 2 of its GPUs
        (
            [
                "cluster.num_nodes=3",
                "cluster.gpus_per_node=8",
                "policy.generation.colocated.enabled=false",
                "policy.generation.colocated.resources.gpus_per_node=8",
                "policy.generation.colocated.resources.num_nodes=1",
            ],
            16,
            8,
        ),
    ],
)
def test_worker_counts_follow_nemo_rls_placement(overrides, training, rollout):
    got, _ = counts(GRPO, overrides)
    assert got == {"training": training, "rollout": rollout}


def test_ids_are_the_ones_the_workers_write():
    _, expected = counts(GRPO, ["cluster.gpus_per_node=4", "policy.generation.vllm_cfg.tensor_parallel_size=2"])
    assert expected["training"].ids == ("policy-rank0", "policy-rank1", "policy-rank2", "policy-rank3")
    # two engines of TP 2, started by generation actors 0 and 2
    assert expected["rollout"].ids == (
        "vllm-rank0-worker0",
        "vllm-rank0-worker1",
        "vllm-rank2-worker0",
        "vllm-rank2-worker1",
    )
    assert "2 vLLM engines x TP 2 x PP 1" in expected["rollout"].how


def test_sft_expects_no_rollout_workers():
    got, expected = counts(EXAMPLES / "sft_megatron_flash.yaml", [], "sft")
    assert got == {"training": 16} and "rollout" not in expected  # the recipe's 2 nodes x 8 GPUs


def test_a_config_without_a_usable_cluster_gives_no_count():
    _, expected = counts(GRPO, ["cluster.gpus_per_node=null", "policy.generation.colocated.enabled=false"])
    assert expected["rollout"].count is None and "cluster.gpus_per_node" in expected["rollout"].how
