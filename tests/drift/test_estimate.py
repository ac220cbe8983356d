"""Attention's share of the drift (``drift.estimate``): estimated, zero by construction, or unavailable."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.config.loader import load_config  # noqa: E402
from nemo_rl_attn_align.drift import estimate  # noqa: E402
from nemo_rl_attn_align.drift import sweep as drift  # noqa: E402
from nemo_rl_attn_align.drift.estimate import (  # noqa: E402
    Engines,
    EstimateRequest,
    attention_only_estimate,
    estimate_engines,
)
from nemo_rl_attn_align.drift.shape import Shape  # noqa: E402
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts, read_recipe_facts  # noqa: E402
from tests.conftest import EXAMPLES  # noqa: E402

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
KEYS = {"status", "training_engine", "rollout_engine", "dtype", "figures", "assumes", "why"}
SMALL = Shape(4, 2, 32, None, 128)


def grpo(*overrides: str) -> RecipeFacts:
    return read_recipe_facts(load_config(GRPO, list(overrides)))


@pytest.fixture(scope="module")
def shipped() -> dict:
    return attention_only_estimate(grpo())


def test_shipped_grpo_example_is_estimated_with_finite_ordered_figures(shipped):
    assert set(shipped) == KEYS and shipped["status"] == "estimated"
    assert (shipped["training_engine"], shipped["rollout_engine"], shipped["dtype"]) == (
        "flash",
        "vllm-fa3:chunk=256",
        "bf16",
    )
    assert set(shipped["figures"]) == {"token_mult_prob_error", "gen_kl_error"}
    for name, floor in (("token_mult_prob_error", 1.0), ("gen_kl_error", 0.0)):
        f = shipped["figures"][name]
        assert all(math.isfinite(f[k]) for k in ("value", "low", "high"))
        assert floor <= f["low"] <= f["value"] <= f["high"]
    # flash and vLLM's FA3 chunked prefill reduce in different orders: some drift, but small
    assert 1.0 < shipped["figures"]["token_mult_prob_error"]["value"] < 1.1
    assert shipped["figures"]["gen_kl_error"]["value"] > 0.0
    assert "not a bound" in shipped["why"]
    assumes = "\n".join(shipped["assumes"])
    assert "12 heads, 2 kv heads, head_dim 128, no window" in assumes and "seq len 512" in assumes
    assert "capped" not in assumes
    assert "random inputs, 3 seeds" in assumes and "random LM head of vocab 512" in assumes
    assert "training engine flash: FlashAttention 2.8.3 on sm90, predicted by check --gpu's selectors" in assumes
    assert "rollout engine vllm-fa3:chunk=256 (chunked prefill, no cascade attention): FLASH_ATTN FA3" in assumes
    assert json.loads(json.dumps(shipped)) == shipped


def test_deterministic(shipped):
    assert attention_only_estimate(grpo()) == shipped


def test_seeds_set_the_spread():
    one = attention_only_estimate(grpo(), seeds=1)["figures"]["token_mult_prob_error"]
    assert one["low"] == one["value"] == one["high"]
    two = attention_only_estimate(grpo(), seeds=2)["figures"]["token_mult_prob_error"]
    # seed 0 is one end of the two seeds' range (which end depends on the CPU's kernels); value is their mean
    assert two["low"] < two["high"] and one["value"] in (two["low"], two["high"])
    assert two["value"] == pytest.approx((two["low"] + two["high"]) / 2, rel=1e-12)


def test_sequence_length_is_capped_and_says_so():
    result = attention_only_estimate(grpo("policy.max_total_sequence_length=4096"), max_seq_len=256, seeds=1)
    assert result["status"] == "estimated"
    assert any("seq len 256 (capped from 4096, policy.max_total_sequence_length" in line for line in result["assumes"])


def test_gpu_selects_the_rollout_replay():
    result = attention_only_estimate(grpo("policy.megatron_cfg.context_parallel_size=2"), gpu="sm80", seeds=1)
    assert result["status"] == "estimated"
    assert (result["training_engine"], result["rollout_engine"]) == ("te-p2p:cp=2", "vllm:chunk=256")


@pytest.mark.parametrize(
    "training, rollout",
    [
        ("reference", "reference"),
        ("flash", "flash:splits=1"),  # the same parameters, one written out
        ("flash:canonical=1", "vllm-fa3:chunk=64,canonical=1"),  # both the canonical order
    ],
)
def test_same_reduction_both_sides_is_zero_by_construction(training, rollout):
    result = estimate_engines(Engines(SMALL, "bf16", training, rollout))
    assert set(result) == KEYS and result["status"] == "zero_by_construction"
    assert result["figures"] == {
        "token_mult_prob_error": {"value": 1.0, "low": 1.0, "high": 1.0},
        "gen_kl_error": {"value": 0.0, "low": 0.0, "high": 0.0},
    }
    assert "same reduction bit for bit" in result["why"] and "attention adds no drift" in result["why"]


def test_zero_by_construction_is_what_the_replays_measure():
    canonical = [drift.parse_materializer(s) for s in ("flash:canonical=1", "vllm-fa3:chunk=64,canonical=1")]
    assert estimate.replay_figures(SMALL, "bf16", *canonical, seeds=2, vocab=64) == {
        "token_mult_prob_error": {"value": 1.0, "low": 1.0, "high": 1.0},
        "gen_kl_error": {"value": 0.0, "low": 0.0, "high": 0.0},
    }
    engines = [drift.parse_materializer(s) for s in ("te-p2p:cp=2", "reference")]
    measured = estimate.replay_figures(SMALL, "bf16", *engines, seeds=2, vocab=64)
    assert measured["token_mult_prob_error"]["low"] > 1.0 and measured["gen_kl_error"]["low"] > 0.0


def test_different_engines_are_not_zero():
    assert estimate_engines(Engines(SMALL, "bf16", "flash", "flash:splits=2"), EstimateRequest(seeds=1))["status"] == (
        "estimated"
    )


def unavailable(result: dict) -> str:
    assert set(result) == KEYS and result["status"] == "unavailable" and result["figures"] == {}
    assert "\n" not in result["why"] and result["why"]
    json.dumps(result)
    return result["why"]


def test_fp32_recipe_is_unavailable_with_the_reason():
    result = attention_only_estimate(grpo("policy.precision=float32"))
    assert result["dtype"] == "fp32"
    why = unavailable(result)
    assert "no training attention backend" in why and "fp32 on sm90" in why
    assert "does not run in fp32" in unavailable(estimate_engines(Engines(SMALL, "fp32", "flash", "reference")))


def test_engine_that_cannot_be_replayed_is_unavailable_with_the_reason():
    result = attention_only_estimate(grpo("policy.megatron_cfg.attention_backend=auto"))  # TE picks cuDNN on sm90
    assert (result["training_engine"], result["rollout_engine"]) == ("te-fused", "vllm-fa3:chunk=256")
    why = unavailable(result)
    assert "te-fused is not replayable" in why and "cuDNN" in why and "not public" in why
    why = unavailable(attention_only_estimate(grpo("policy.megatron_cfg.attention_backend=unfused")))
    assert why.startswith("no materializer replays the training kernel UnfusedDotProductAttention")


@pytest.mark.parametrize(
    "read, kwargs, message",
    [
        (lambda: read_recipe_facts({}), {}, "the config has no `policy:` section"),
        (grpo, {"gpu": "sm70"}, "no kernel prediction for this GPU"),
        (grpo, {"seeds": 0}, "seeds=0 must be an integer >= 1"),
        (grpo, {"max_seq_len": 0}, "max_seq_len=0 is not a positive integer"),
        (lambda: grpo("policy.megatron_cfg.enabled=false"), {}, "policy.megatron_cfg is not enabled"),
        (lambda: read_recipe_facts(load_config(EXAMPLES / "sft_megatron_flash.yaml")), {}, "no vLLM rollout side"),
        (
            lambda: grpo("policy.generation.vllm_cfg.precision=float16"),
            {},
            "differs from policy.precision='bfloat16'",
        ),
        (lambda: grpo("policy.model_name=acme/unknown"), {}, "attention shape unknown"),
    ],
)
def test_bad_input_is_unavailable_never_raised(read, kwargs, message):
    assert message in unavailable(attention_only_estimate(read(), **kwargs))


def test_a_failure_inside_the_replays_is_one_line(monkeypatch):
    def boom(shape, seed):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(drift, "make_inputs", boom)
    result = attention_only_estimate(grpo(), seeds=1)
    assert unavailable(result) == "RuntimeError: boom"
    assert (result["training_engine"], result["dtype"]) == ("flash", "bf16") and result["assumes"]


def test_module_imports_without_torch():
    code = "import sys; import nemo_rl_attn_align.drift.estimate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_gpu_is_the_driver_nodes_as_nvidia_smi_reports_it_else_sm90(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 8.0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = attention_only_estimate(grpo(), seeds=1)
    assert "GPU sm80: this machine's GPU (nvidia-smi), on the driver's node" in result["assumes"]
    assert result["rollout_engine"].startswith("vllm:")  # FA2's replay on Ampere
    smi.write_text("#!/bin/sh\nexit 9\n")
    result = attention_only_estimate(grpo(), seeds=1)
    assert any(line.startswith("GPU assumed sm90: nvidia-smi reports") for line in result["assumes"])
