"""``check --gpu`` on NeMo-RL's own recipes (ref 7ea279a): both kernels of its Megatron-generation
recipes (its gpt-oss recipe's documented kernel pair: tests/upstream_bugs/test_gpu_generation.py).

The recipes are read unmodified from the snapshot (their ``defaults:`` chains resolved by ``check``);
their models come from the test session's Hugging Face cache (``tests/example_models.py``).
"""

from __future__ import annotations

import pytest

from tests.real_nemo_rl.conftest import check_recipe

pytestmark = pytest.mark.real_nemo_rl

RECIPES = "examples/configs/recipes/llm"
MEGATRON_GENERATION = (
    "grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml",
    "grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml",
)


def check(recipe: str, *args: str) -> dict:
    return check_recipe(f"{RECIPES}/{recipe}", *args)[0]


def _pairs(result: dict) -> list[dict]:
    return [f for f in result["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]


@pytest.mark.parametrize("recipe", MEGATRON_GENERATION)
def test_megatron_generation_recipes_name_both_kernels(recipe):
    result = check(recipe, "--gpu", "H100")
    (training,) = result["kernels"]["training"]
    (rollout,) = result["kernels"]["rollout"]
    assert training["kernel"] == "FusedAttention" and rollout["label"] == "flash_attn FA2"
    assert "Attention._resolve_flash_version" in rollout["source"]
    (pair,) = _pairs(result)
    assert pair["key"] == "policy.megatron_cfg.model_overrides.flash_attention_version"
    flash = (
        "++policy.megatron_cfg.attention_backend=flash",
        "++policy.megatron_cfg.model_overrides.flash_attention_version=3",
    )
    pinned = check(recipe, *flash, "--fa3", "--gpu", "H100")
    assert pinned["kernels"]["training"][0]["label"].startswith("FlashAttention 3")
    assert pinned["kernels"]["rollout"][0]["label"] == "flash_attn FA3" and not _pairs(pinned)
