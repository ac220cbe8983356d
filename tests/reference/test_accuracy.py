"""The reference against FP64 exact attention, within the bound stated in ``attention.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.drift import ulp_of  # noqa: E402
from nemo_rl_attn_align.reference.attention import exact_attention, reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.blocks import ReferenceSpec  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, make_qkv  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 23])
@pytest.mark.parametrize("spec", [SPEC, ReferenceSpec()])
def test_within_one_ulp_of_fp64(dtype, window, spec):
    q, k, v = make_qkv(dtype, seq_q=150, seq_kv=170, head_dim=32)
    out, lse = reference_attention(q, k, v, window=window, spec=spec)
    out64, lse64 = exact_attention(q, k, v, window=window)
    bound = ulp_of(out64, dtype) + 2.0 ** -20 * v.abs().max().double()
    assert ((out.double() - out64).abs() <= bound).all()
    assert ((lse.double() - lse64).abs() <= 2.0 ** -20 * (1 + lse64.abs())).all()
    # and the error is real rounding, not zero: bf16/fp16 output cannot hold the FP64 value
    assert (out.double() - out64).abs().max() > 0


def test_fp32_inputs_bound():
    q, k, v = make_qkv(torch.float32, seq_q=150, head_dim=32)
    out, lse = reference_attention(q, k, v, spec=SPEC)
    out64, lse64 = exact_attention(q, k, v)
    assert (out.double() - out64).abs().max() <= 2.0 ** -19 * v.abs().max()
    assert ((lse.double() - lse64).abs() <= 2.0 ** -20 * (1 + lse64.abs())).all()


def test_rejects_mismatched_inputs():
    q, k, v = make_qkv(torch.bfloat16)
    with pytest.raises(ValueError, match="share one of"):
        reference_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="multiple"):
        reference_attention(q[:, :3], k, v)
