"""``probe CONFIG [OVERRIDES...]`` end to end, as a user runs it: the shipped GRPO example pointed at
a tiny checkpoint by Hydra overrides, both sides read from the recipe (Megatron-Bridge in lane
nemo_rl's venv, vLLM in lane vllm's), the preset applied as the run starts, and what cannot run on
this machine named. What holds: in float32 the engines agree to float32 rounding (``ATOL``) at
every stage with RoPE and attention adding nothing measurable, and a provider field set through
the recipe's ``model_overrides`` reaches the training side (a softmax scale: core attention, layer 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nemo_rl_attn_align.config.example_recipes import default_example_path
from tests.real_cross_engine.conftest import REPO
from tests.real_cross_engine.test_bridge_vs_vllm import ATOL
from tests.real_vllm.conftest import KV_CACHE_GIB

pytestmark = pytest.mark.real_cross_engine


#: The overrides that point the shipped example at the tiny checkpoint in float32 on CPU (docs/probe.md's
#: example shows the same command: tests/test_readme.py compares them).
ON_CPU = (
    "policy.precision=float32",
    "policy.generation.vllm_cfg.precision=float32",
    "policy.generation.vllm_cfg.max_model_len=128",
    "++policy.generation.vllm_kwargs.block_size=32",
)


def probe_recipe(pythons, checkpoint, *overrides: str) -> dict:
    """``probe`` on the shipped example, on ``checkpoint``, in float32 on CPU, with ``overrides``."""
    command = [sys.executable, "-m", "nemo_rl_attn_align", "probe", str(default_example_path())]
    command += [f"policy.model_name={checkpoint}", *ON_CPU, *overrides]
    command += ["--training-python", pythons[0], "--rollout-python", pythons[1], "--atol", str(ATOL), "--json"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB}
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_recipe_probed_on_a_checkpoint_agrees_and_says_what_ran_otherwise(pythons, checkpoint):
    result = probe_recipe(pythons, checkpoint)
    assert result["first_divergence"] is None, result["verdict"]
    for row in result["layers"]:
        assert row["rope_share"]["max_abs"] < ATOL and row["attention_share"]["max_abs"] < ATOL
    assert result["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-6)
    assert any(
        note.startswith("preset aligned sets policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT='1'")
        for note in result["notes"]
    )
    training, rollout = result["substitutions"]["training"], result["substitutions"]["rollout"]
    assert "attention_backend: local (was flash)" in training and "apply_rope_fusion: False (was True)" in training
    assert rollout == ["VLLM_BATCH_INVARIANT off (its kernels are Triton GPU kernels)"]


def test_a_provider_field_set_in_the_recipe_reaches_the_training_side(pythons, checkpoint):
    result = probe_recipe(pythons, checkpoint, "++policy.megatron_cfg.model_overrides.softmax_scale=0.1")
    first = result["first_divergence"]
    assert (first["layer"], first["stage"]) == (0, "attention")
    assert result["layers"][0]["attention_share"]["max_abs"] == pytest.approx(first["max_abs"], rel=1e-3)
    assert result["layers"][0]["rope_share"]["max_abs"] < ATOL


def test_the_recipe_in_bfloat16_runs_on_cpu_without_the_fused_softmax(pythons, checkpoint):
    """The recipe's own precision: megatron-core's fused masked softmax (a CUDA extension it calls in
    half precision) is turned off on CPU and named, as the other CUDA-only settings are."""
    result = probe_recipe(
        pythons, checkpoint, "policy.precision=bfloat16", "policy.generation.vllm_cfg.precision=bfloat16"
    )
    assert "masked_softmax_fusion: False (was True)" in result["substitutions"]["training"]
    assert result["token_mult_prob_error"] == pytest.approx(1.0, abs=0.05)
