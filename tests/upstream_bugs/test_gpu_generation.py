"""Upstream bug 6, one GPU generation worse than another (NeMo-RL #1774): gpt-oss's logprob error much
higher on GB200 than on H100. The configs are the same; the kernel pair is not: on Blackwell vLLM's
default for gpt-oss's sinks is FLASHINFER, which runs TRT-LLM attention, and NeMo-RL's own fix is
to force ``TRITON_ATTN`` in its gpt-oss recipe. ``check --gpu`` on NeMo-RL's recipe (7ea279a, read
unmodified from the snapshot, its model from the session's Hugging Face cache), as a user runs it
before launch: without the recipe's fix (the line removed on the command line) GB200 warns of the
pair NeMo-RL documents and H100 does not; with the fix, GB200 does not either.
"""

from __future__ import annotations

import pytest

from tests.real_nemo_rl.conftest import check_recipe

pytestmark = pytest.mark.real_nemo_rl

RECIPE = "examples/configs/recipes/llm/grpo-gptoss-20b-8n4g-megatron.yaml"
FIX = "policy.generation.vllm_kwargs.attention_backend"
CODE = "KERNEL_PAIR_DOCUMENTED"


def check(*args: str) -> tuple[dict, str]:
    """``check RECIPE ARGS`` as JSON and as text."""
    return check_recipe(RECIPE, *args)


def _pairs(result: dict) -> list[dict]:
    return [f for f in result["kernels"]["findings"] if f["code"] == CODE]


@pytest.mark.parametrize("gpu", ["GB200", "B300"])
def test_nemo_rl_1774_blackwell_warns_of_the_kernel_pair_h100_does_not(gpu):
    blackwell, text = check(f"~{FIX}", "--gpu", gpu)
    assert {kind["kernel"] for kind in blackwell["kernels"]["rollout"]} == {"FLASHINFER"}
    (pair,) = _pairs(blackwell)
    assert pair["severity"] == "warning" and pair["key"] == FIX and pair["value"] is None
    assert "TRT-LLM attention, which computes attention inconsistently with Megatron/TE" in pair["message"]
    assert "grpo-gptoss-20b-8n4g-megatron.yaml" in pair["message"]
    assert pair["fix"] == f"set {FIX}=TRITON_ATTN."
    [line] = [line for line in text.splitlines() if f"warning {CODE}" in line]
    assert line.lstrip().startswith(f"warning {CODE}: {FIX}") and f"Fix: set {FIX}=TRITON_ATTN." in line
    print(line)
    hopper, _ = check(f"~{FIX}", "--gpu", "H100")
    assert {kind["kernel"] for kind in hopper["kernels"]["rollout"]} != {"FLASHINFER"}
    assert _pairs(hopper) == []


@pytest.mark.parametrize("gpu", ["GB200", "B300"])
def test_with_nemo_rls_fix_blackwell_runs_triton_and_nothing_is_named(gpu):
    fixed, _ = check("--gpu", gpu)
    assert {kind["kernel"] for kind in fixed["kernels"]["rollout"]} == {"TRITON_ATTN"}
    assert _pairs(fixed) == []
