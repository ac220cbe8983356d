"""Upstream bug 4, fused RoPE in bf16 (NeMo-RL #1801, open): with ``apply_rope_fusion`` on,
``token_mult_prob_error`` spiked on every step. Nothing to revert: NeMo-RL 7ea279a still ships fusion
on by default. ``check --fix`` on its own GRPO Megatron recipe (read unmodified from the snapshot), as
a user runs it before launch: the training side's fused RoPE against vLLM's own is named (field
``rope_fusion``, training side) and ``apply_rope_fusion: false`` is recommended, never applied by
the preset; with the user's fix on the command line nothing is recommended.
"""

from __future__ import annotations

import json

import pytest

from tests.real_nemo_rl.conftest import check_recipe

pytestmark = pytest.mark.real_nemo_rl

RECIPE = "examples/configs/grpo_math_1B_megatron.yaml"
KEY = "policy.megatron_cfg.apply_rope_fusion"
OVERRIDE = f"'++{KEY}=false'"


def check(*args: str) -> tuple[dict, str]:
    """``check RECIPE ARGS --fix`` as JSON and as text."""
    return check_recipe(RECIPE, *args, "--fix")


def _rope_fusion(result: dict) -> list[dict]:
    return [f for f in result["attention_align"]["binding"]["findings"] if f["key"] == "contract.recorded.rope_fusion"]


def test_nemo_rl_1801_fused_rope_in_training_is_named_and_unfused_recommended():
    result, text = check()
    (found,) = _rope_fusion(result)
    assert found["code"] == "ATTN_RECORDED_DIFFERENCE" and found["value"] == "training=True, rollout=None"
    assert result["attention_align"]["training"]["fields"]["rope_fusion"]["source"].startswith(KEY)
    (recommended,) = result["fix"]["recommended"]
    assert (recommended["key"], recommended["value"], recommended["override"]) == (KEY, False, OVERRIDE)
    assert "NeMo-RL #1801" in recommended["reason"]
    assert OVERRIDE not in json.dumps(result["fix"]["changes"])  # recommended, never applied
    [line] = [line for line in text.splitlines() if line.startswith("fix: also recommended:")]
    assert line.startswith(f"fix: also recommended: {OVERRIDE} (training applies RoPE with Transformer Engine's fused")
    print(line)


def test_with_rope_fusion_off_nothing_about_rope_is_named():
    result, text = check(f"++{KEY}=false")
    assert [f["value"] for f in _rope_fusion(result)] in ([], ["training=False, rollout=None"])
    assert result["fix"]["recommended"] == [] and "also recommended" not in text
