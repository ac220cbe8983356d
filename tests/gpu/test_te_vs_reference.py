"""TE's FlashAttention against the reference attention on the same BF16 inputs, within a stated bound.

TE's ``DotProductAttention`` is called directly with only FlashAttention allowed
(``NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0 NVTE_UNFUSED_ATTN=0``), on Qwen3-8B attention shapes
(32 query heads, 8 KV heads, head dim 128), causal, in bshd, sbhd and packed thd (``cu_seqlens``,
as NeMo-RL packs sequences). The bound, per output element, is derived in
``tests/gpu/attention_runner.py``: with ``A = P·|V|`` and ``O`` the exact FP64 output,
``|TE - reference| <= 2^-8·A + 2^-8·|O| + 2^-11·A + 2^-7·|O| + 2^-20·max|v|``
(FlashAttention rounds ``P`` to BF16 before ``P·V`` and rounds its FP32 output once; the
reference is within one BF16 ulp of ``O``), and ``|TE - exact|`` without the reference's part.
``tests/gpu/test_suite_inputs.py`` checks on CPU that FlashAttention's arithmetic stays inside it
(ratio 0.6-0.75) while plain BF16 attention, which rounds the scores, does not (5-6.5).
"""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND
from tests.gpu.cases import run_case

pytestmark = pytest.mark.mcore

SPEC = {
    "seed": 2024,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "cases": [
        {"format": "bshd", "seqlens": [1024, 1024], "q_scale": 1.0},
        {"format": "sbhd", "seqlens": [1000], "q_scale": 3.0},  # not a multiple of any kernel tile; a peaked softmax
        {"format": "thd", "seqlens": [384, 1000, 129, 7], "q_scale": 3.0},
    ],
}


def test_te_flash_is_within_the_bf16_bound_of_the_reference(tmp_path, record_property):
    result = run_case("attention_runner", SPEC, tmp_path, env=NVTE_BY_BACKEND["flash"], name="flash")
    assert [c["format"] for c in result["cases"]] == [c["format"] for c in SPEC["cases"]]
    for case in result["cases"]:
        record_property(f"{case['format']}_max_te_vs_reference", case["max_te_vs_reference"])
        record_property(f"{case['format']}_ratio_to_bound", case["ratio_te_vs_reference"])
        assert case["backend"] == "FlashAttention", case
        assert case["ratio_te_vs_exact"] <= 1.0, case
        assert case["ratio_te_vs_reference"] <= 1.0, case
