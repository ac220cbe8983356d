"""The reference's backward: same bits whatever the forward's plan or batch makeup, within the bound
stated in ``reference/backward.py`` of autograd through FP64 attention, close to SDPA in FP32."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.drift.sweep import ulp_of  # noqa: E402
from nemo_rl_attn_align.reference.attention import reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.blocks import ReferenceSpec  # noqa: E402
from nemo_rl_attn_align.reference.causal import Causal  # noqa: E402
from nemo_rl_attn_align.reference.plans import ChunkedPrefill, ContextParallel, SinglePass, SplitKV  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, assert_same_bits, make_qkv, pack  # noqa: E402

WINDOWS = [None, 23]
#: The FP32 term of the bound in ``backward.py``.
FP32_SLACK = 2.0**-14


def incoming(q, seed=7):
    """Random ``dout`` ``[Tq, Hq, D]`` (q's dtype) and ``dlse`` ``[Tq, Hq]`` (FP32)."""
    gen = torch.Generator().manual_seed(seed)
    dout = torch.randn(q.shape, generator=gen).to(q.dtype).to(q.device)
    return dout, torch.randn(q.shape[:2], generator=gen).to(q.device)


def reference_grads(q, k, v, dout, dlse, window=None, plan=None, spec=SPEC, **kw):
    """``(out, lse, dq, dk, dv)`` of the reference for loss ``<out, dout> + <lse, dlse>``."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = reference_attention(*leaves, Causal(window, **kw), plan=plan, spec=spec)
    loss = (out.float() * dout.float()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse).sum()
    loss.backward()
    return (out.detach(), lse.detach(), *(x.grad for x in leaves))


def fp64_attention(q, k, v, window=None):
    """Plain differentiable FP64 attention of one sequence (bottom-right causal, GQA): ``(out, lse, P)``."""
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    kk, vv = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))  # [Skv, Hq, D]
    s = torch.einsum("ihd,jhd->hij", q, kk) / math.sqrt(d)  # [Hq, Sq, Skv]
    i = torch.arange(sq)[:, None] + skv - sq
    j = torch.arange(skv)[None, :]
    visible = (j <= i) & (j >= i - window) if window is not None else j <= i
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # [Hq, Sq]
    p = torch.exp(s - lse[..., None])
    return torch.einsum("hij,jhd->ihd", p, vv), lse.T, p


def fp64_grads_and_magnitudes(q, k, v, dout, dlse, window=None):
    """FP64 autograd gradients of the same loss, and the magnitudes ``A`` of the bound."""
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out, lse, p = fp64_attention(q64, k64, v64, window)
    dout64, dlse64 = dout.double(), dlse.double()
    ((out * dout64).sum() + (lse * dlse64).sum()).backward()
    hkv, g = k.shape[1], q.shape[1] // k.shape[1]
    p, out = p.detach(), out.detach()
    ak, av = (x.detach().abs().repeat_interleave(g, dim=1) for x in (k64, v64))
    c = (
        torch.einsum("ihd,jhd->hij", dout64.abs(), av)
        + ((dout64.abs() * out.abs()).sum(-1) + dlse64.abs()).T[..., None]
    )
    scale = 1.0 / math.sqrt(q.shape[-1])
    a_q = scale * torch.einsum("hij,jhd->ihd", p * c, ak)
    a_k = scale * torch.einsum("hij,ihd->jhd", p * c, q64.detach().abs()).unflatten(1, (hkv, g)).sum(2)
    a_v = torch.einsum("hij,ihd->jhd", p, dout64.abs()).unflatten(1, (hkv, g)).sum(2)
    return (q64.grad, k64.grad, v64.grad), (a_q, a_k, a_v)


def bound_ratio(got, exact, magnitude, dtype):
    """Largest ``|got - exact| / (ulp(dtype, exact) + 2**-14 * A)`` (<= 1 means within the bound)."""
    return float(((got.double() - exact).abs() / (ulp_of(exact, dtype) + FP32_SLACK * magnitude)).max())


def assert_same_grads(a, b):
    assert_same_bits(a[:2], b[:2])
    for name, x, y in zip(("dq", "dk", "dv"), a[2:], b[2:], strict=True):
        assert torch.equal(x, y), f"{name} differs, max |d| = {(x.double() - y.double()).abs().max()}"


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
@pytest.mark.parametrize("plan", [None, ContextParallel(4), SplitKV(num_splits=3), ChunkedPrefill(7, 16)])
def test_differentiable_forward_has_the_plain_forwards_bits(dtype, plan):
    q, k, v = make_qkv(dtype)
    plain = reference_attention(q, k, v, Causal(23), plan=plan, spec=SPEC)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = reference_attention(*leaves, Causal(23), plan=plan, spec=SPEC)
    assert out.requires_grad and lse.requires_grad and out.dtype == dtype
    assert_same_bits((out.detach(), lse.detach()), plain)
    with torch.no_grad():
        off = reference_attention(*leaves, Causal(23), plan=plan, spec=SPEC)
    assert not off[0].requires_grad
    assert_same_bits(off, plain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_grads_same_bits_whatever_the_forward_plan(dtype, window):
    q, k, v = make_qkv(dtype)
    dout, dlse = incoming(q)
    base = reference_grads(q, k, v, dout, dlse, window)
    assert all(g.abs().max() > 0 for g in base[2:])
    plans = [
        SinglePass(),
        ContextParallel(4),
        ContextParallel(2, "contiguous", "all_gather"),
        SplitKV(num_splits=3),
        SplitKV(split_size=20),
        ChunkedPrefill(7, 16, num_splits=3),
    ]
    for plan in plans:
        assert_same_grads(base, reference_grads(q, k, v, dout, dlse, window, plan))
    assert_same_grads(base, reference_grads(q, k, v, dout, dlse, window))  # and run to run


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_grads_same_bits_alone_and_packed(dtype, window):
    q, k, v = make_qkv(dtype, seq_q=37, seq_kv=70, seed=1)  # a 33-token cached prefix
    dout, dlse = incoming(q)
    alone = reference_grads(q, k, v, dout, dlse, window)
    others = [make_qkv(dtype, seq_q=n, seq_kv=m, seed=s) for n, m, s in ((50, 50, 2), (0, 9, 3), (64, 64, 4))]
    for position in range(len(others) + 1):
        batch = [*others[:position], (q, k, v), *others[position:]]
        packed, cu_q, cu_k = pack(batch)
        pdout, pdlse = incoming(packed[0], seed=position)
        rows = slice(int(cu_q[position]), int(cu_q[position + 1]))
        keys = slice(int(cu_k[position]), int(cu_k[position + 1]))
        pdout[rows], pdlse[rows] = dout, dlse
        got = reference_grads(
            *packed,
            pdout,
            pdlse,
            window,
            ChunkedPrefill(8) if position % 2 else None,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
        )
        assert_same_grads(alone, (got[0][rows], got[1][rows], got[2][rows], got[3][keys], got[4][keys]))
        no_queries = 2 if position <= 1 else 1  # where others[1] (no queries) sits
        zero_keys = slice(int(cu_k[no_queries]), int(cu_k[no_queries + 1]))
        assert not got[3][zero_keys].any() and not got[4][zero_keys].any()


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("spec", [SPEC, ReferenceSpec()])
@pytest.mark.parametrize("uses", ["out", "out+lse", "lse"])
def test_grads_within_the_bound_of_fp64(dtype, window, spec, uses):
    q, k, v = make_qkv(dtype, seq_q=101, seq_kv=120)
    dout, dlse = incoming(q)
    if uses == "lse":
        dout = torch.zeros_like(dout)
    got = reference_grads(q, k, v, dout, dlse if "lse" in uses else None, window, spec=spec)
    exact, magnitudes = fp64_grads_and_magnitudes(
        q, k, v, dout, dlse if "lse" in uses else torch.zeros_like(dlse), window
    )
    for name, g, g64, a in zip(("dq", "dk", "dv"), got[2:], exact, magnitudes, strict=True):
        assert g.dtype == dtype
        assert bound_ratio(g, g64, a, dtype) <= 1.0, name
        if dtype != torch.float32 and not (uses == "lse" and name == "dv"):
            assert (g.double() - g64).abs().max() > 0  # real rounding, not a copy
    if uses == "lse":
        assert not got[4].any()  # dv = P^T dO = 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_bound_is_tight_enough_to_reject_plain_input_dtype_autograd(dtype):
    """Autograd through plain attention in the input dtype breaks the bound several times over."""
    q, k, v = make_qkv(dtype, seq_q=101, seq_kv=120)
    dout, _ = incoming(q)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _, _ = fp64_attention(*leaves)  # same formula, run in bf16/fp16
    (out * dout).sum().backward()
    exact, magnitudes = fp64_grads_and_magnitudes(q, k, v, dout, torch.zeros(q.shape[:2]))
    assert max(bound_ratio(x.grad, g64, a, dtype) for x, g64, a in zip(leaves, exact, magnitudes, strict=True)) > 4


@pytest.mark.parametrize("window", WINDOWS)
def test_fp32_grads_close_to_sdpa_autograd(window):
    q, k, v = make_qkv(torch.float32)
    dout, _ = incoming(q)
    got = reference_grads(q, k, v, dout, None, window)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    mask = None
    if window is not None:
        i, j = torch.arange(q.shape[0])[:, None], torch.arange(k.shape[0])[None, :]
        mask = (j <= i) & (j >= i - window)
    heads_first = [x.transpose(0, 1) for x in leaves]  # [H, S, D]
    out = torch.nn.functional.scaled_dot_product_attention(
        *heads_first, attn_mask=mask, is_causal=mask is None, enable_gqa=True
    ).transpose(0, 1)
    out.backward(dout)
    torch.testing.assert_close(got[0], out.detach(), rtol=1e-5, atol=1e-5)
    for g, x in zip(got[2:], leaves, strict=True):
        torch.testing.assert_close(g, x.grad, rtol=1e-5, atol=1e-5 * float(x.grad.abs().max()))


def test_grad_of_one_input_alone():
    q, k, v = make_qkv(torch.bfloat16)
    dout, dlse = incoming(q)
    every = reference_grads(q, k, v, dout, dlse, 23)
    k_only = k.clone().requires_grad_()
    out, lse = reference_attention(q, k_only, v, Causal(23), spec=SPEC)
    ((out.float() * dout.float()).sum() + (lse * dlse).sum()).backward()
    assert torch.equal(k_only.grad, every[3])


def test_every_tensor_is_made_on_the_inputs_device():
    """A CPU stand-in for CUDA: inside ``torch.device("meta")`` a mask or index made without the
    inputs' device lands on ``meta`` and fails when it meets them, as a CPU one would on CUDA
    (``masked_fill_`` demands the mask on ``self``'s device)."""
    q, k, v = make_qkv(torch.bfloat16)
    dout, dlse = incoming(q)
    for plan in (
        None,
        ContextParallel(4),
        ContextParallel(2, comm="all_gather"),
        SplitKV(num_splits=3),
        ChunkedPrefill(7, 16),
    ):
        with torch.device("meta"):
            out, lse, dq, dk, dv = reference_grads(q, k, v, dout, dlse, 23, plan)
        assert {x.device.type for x in (out, lse, dq, dk, dv)} == {"cpu"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_grads_same_bits_and_within_bound(dtype):
    q, k, v = make_qkv(dtype, device="cuda")
    dout, dlse = incoming(q)
    base = reference_grads(q, k, v, dout, dlse, 23)
    for plan in (ContextParallel(4), SplitKV(num_splits=3)):
        assert_same_grads(base, reference_grads(q, k, v, dout, dlse, 23, plan))
    exact, magnitudes = fp64_grads_and_magnitudes(*(x.cpu() for x in (q, k, v, dout, dlse)), 23)
    for g, g64, a in zip(base[2:], exact, magnitudes, strict=True):
        assert bound_ratio(g.cpu(), g64, a, dtype) <= 1.0
