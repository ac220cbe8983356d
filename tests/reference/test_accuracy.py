"""The reference against FP64 exact attention, within the bound stated in ``attention.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.drift.sweep import ulp_of  # noqa: E402
from nemo_rl_attn_align.reference.attention import exact_attention, logit_magnitude, reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.blocks import ReferenceSpec  # noqa: E402
from nemo_rl_attn_align.reference.causal import Causal  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, make_qkv  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 23])
@pytest.mark.parametrize("spec", [SPEC, ReferenceSpec()])
def test_within_one_ulp_of_fp64(dtype, window, spec):
    q, k, v = make_qkv(dtype, seq_q=150, seq_kv=170, head_dim=32)
    out, lse = reference_attention(q, k, v, Causal(window), spec=spec)
    out64, lse64 = exact_attention(q, k, v, Causal(window))
    bound = ulp_of(out64, dtype) + 2.0**-20 * v.abs().max().double()
    assert ((out.double() - out64).abs() <= bound).all()
    assert ((lse.double() - lse64).abs() <= 2.0**-20 * (1 + lse64.abs())).all()
    # and the error is real rounding, not zero: bf16/fp16 output cannot hold the FP64 value
    assert (out.double() - out64).abs().max() > 0


def test_fp32_inputs_bound():
    q, k, v = make_qkv(torch.float32, seq_q=150, head_dim=32)
    out, lse = reference_attention(q, k, v, spec=SPEC)
    out64, lse64 = exact_attention(q, k, v)
    assert (out.double() - out64).abs().max() <= 2.0**-19 * v.abs().max()
    assert ((lse.double() - lse64).abs() <= 2.0**-20 * (1 + lse64.abs())).all()


def large_logit_case(dtype, q_scale):
    """Errors of the reference against FP64 with ``q`` scaled, and the bounds of ``attention.py``:
    ``(|d out|, |d lse|, out bound, lse bound, out bound without its logit term)``."""
    q, k, v = make_qkv(torch.float32, seq_q=150, seq_kv=170, head_dim=32)
    q, k, v = (q * q_scale).to(dtype), k.to(dtype), v.to(dtype)
    out, lse = reference_attention(q, k, v, spec=SPEC)
    out64, lse64 = exact_attention(q, k, v)
    d, vmax, m = q.shape[-1], float(v.abs().max()), logit_magnitude(q, k)
    base = 2.0**-19 * vmax if dtype == torch.float32 else ulp_of(out64, dtype) + 2.0**-20 * vmax
    lse_bound = 2.0**-20 * (1 + lse64.abs()) + 2.0**-24 * (d + 2) * m
    return (
        (out.double() - out64).abs(),
        (lse.double() - lse64).abs(),
        base + 2.0**-23 * (d + 2) * m * vmax,
        lse_bound,
        base,
    )


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
@pytest.mark.parametrize("q_scale", [1, 10, 100])
def test_within_the_bound_with_large_logits(dtype, q_scale):
    d_out, d_lse, out_bound, lse_bound, _ = large_logit_case(dtype, q_scale)
    assert (d_out <= out_bound).all() and (d_lse <= lse_bound).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_logit_term_is_needed(dtype):
    """Without it the bound fails at large logits: the error grows with |s| (FP32 dot products)."""
    d_out, _, _, _, without_logit_term = large_logit_case(dtype, 100)
    assert not (d_out <= without_logit_term).all()


def test_logit_magnitude_is_the_largest_scaled_abs_dot_product():
    q = torch.tensor([[[1.0, -2.0]], [[0.5, 0.5]]])  # [2 tokens, 1 head, D=2]
    k = torch.tensor([[[3.0, 1.0]], [[-1.0, 4.0]]])
    # |q0|.|k1| = 1 + 8 = 9 is the largest; scale 1/sqrt(2)
    assert logit_magnitude(q, k) == pytest.approx(9 / 2**0.5)


def test_rejects_mismatched_inputs():
    q, k, v = make_qkv(torch.bfloat16)
    with pytest.raises(ValueError, match="share one of"):
        reference_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="multiple"):
        reference_attention(q[:, :3], k, v)
