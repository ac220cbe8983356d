"""Deterministic reference attention (what all drift is measured against) and an FP64 exact one.

``reference_attention`` returns ``(out, lse)``: FP32 partials per (query tile, KV block), merged by
the online-softmax rule in global block-index order, downcast once. Its bits do not depend on the
execution plan (CP size and layout, KV splits, chunked prefill and page size, batch makeup); see
``blocks`` for why. Works on CPU and CUDA tensors alike (on CUDA, TF32 is switched off while it
runs so FP32 matmuls stay FP32).

Accuracy, checked against ``exact_attention`` (FP64 softmax attention on the same rounded
inputs) by the tests, with ``M = logit_magnitude(q, k)`` (the largest ``scale * sum_d |q_d| |k_d|``
over query/key pairs: what bounds the FP32 rounding of a score) and ``D`` the head dim. bf16/fp16
inputs: every output element is within one unit in the last place of the output dtype at the exact
value, plus ``2**-20 * max|v|`` for values near zero, plus ``2**-23 * (D + 2) * M * max|v|``;
``|lse - lse64| <= 2**-20 * (1 + |lse64|) + 2**-24 * (D + 2) * M``. FP32 inputs: ``|out - out64|
<= 2**-19 * max|v| + 2**-23 * (D + 2) * M * max|v|``. The logit term is the FP32 error of a score
(``(D + 2) * 2**-24 * M``: the dot product and the exponent's argument) carried to the output
through ``d out / d s_j = p_j (v_j - out)``; at N(0, 1) inputs it is far below an ulp of bf16 or
fp16, but it grows with the logits: with ``q`` scaled by 100 the output is up to 1.8 ulp
(fp16) from FP64, past the one-ulp term alone. Measured on N(0, 1) inputs away from zero: up to
0.54 ulp, i.e. one ulp is needed (the result is not always the correctly rounded one).

Gradients: when ``q``, ``k`` or ``v`` requires grad, ``out`` and ``lse`` are differentiable through
the canonical backward of ``backward`` (its order, invariance and FP64 bound are stated there).

Layout: ``q`` ``[Tq, Hq, D]``, ``k``/``v`` ``[Tk, Hkv, D]``, packed ("thd") when the ``Causal``
gives ``cu_seqlens_q`` / ``cu_seqlens_k`` (FlashAttention's varlen convention), one sequence otherwise. Returns
``out`` ``[Tq, Hq, D]`` in ``q.dtype`` and ``lse`` ``[Tq, Hq]`` in FP32 (natural log).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from nemo_rl_attn_align.reference.backward import BackwardInputs, attention_backward
from nemo_rl_attn_align.reference.blocks import Geometry, ReferenceSpec
from nemo_rl_attn_align.reference.causal import Causal
from nemo_rl_attn_align.reference.plans import SinglePass

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@contextlib.contextmanager
def fp32_matmuls(device: torch.device):
    """Keep FP32 matmuls in FP32 on CUDA (no TF32) for the duration; a no-op on CPU."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _check(q, k, v):
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(
            f"expected q [T, Hq, D] and k, v [T, Hkv, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of {SUPPORTED_DTYPES}; got {q.dtype}, {k.dtype}, {v.dtype}")


def reference_attention(q, k, v, causal: Causal = Causal(), *, plan=None, spec: ReferenceSpec = ReferenceSpec()):
    """``causal`` GQA attention in the canonical order: ``(out, lse)``.

    ``plan`` (default ``SinglePass()``) picks who computes which block; it never changes the result.
    When ``q``, ``k`` or ``v`` requires grad (and grad mode is on), ``out`` and ``lse`` are
    differentiable through the canonical backward of ``backward`` (same forward bits; the
    backward's bits do not depend on ``plan`` either). Double backward is not supported.
    """
    _check(q, k, v)
    call = _Call(causal, SinglePass() if plan is None else plan, spec)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Differentiable.apply(q, k, v, call)
    return call.forward(q, k, v)


@dataclass(frozen=True)
class _Call:
    """One call of the reference: what it computes (``causal``), who computes which block (``plan``),
    on which tiles (``spec``)."""

    causal: Causal
    plan: Any
    spec: ReferenceSpec

    def forward(self, q, k, v):
        """``(out [Tq, Hq, D] q.dtype, lse [Tq, Hq] FP32)`` over the packed sequences."""
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        with torch.no_grad(), fp32_matmuls(q.device):
            for rows, keys, geom in self.causal.sequences(q, k):
                out[rows], lse[rows] = self.plan.run(q[rows], k[keys], v[keys], geom, self.spec)
        return out, lse


def logit_magnitude(q, k, scale: float | None = None) -> float:
    """``scale * max_{i,j} sum_d |q[i, h, d]| * |k[j, h // g, d]|`` over every query/key pair (FP64),
    the ``M`` of the accuracy bound (masking ignored: an upper bound)."""
    _check(q, k, k)
    g = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k_abs = k.double().abs()
    best = 0.0
    for h in range(q.shape[1]):  # one head at a time bounds the memory
        best = max(best, float((q[:, h].double().abs() @ k_abs[:, h // g].T).max()))
    return scale * best


class _Differentiable(torch.autograd.Function):
    """``reference_attention`` with ``backward.attention_backward`` as its gradient.

    The forward runs on FP32 copies of the inputs: every partial is FP32 anyway, so this is the
    same arithmetic, and rounding its FP32 output gives the same bits as the plain call; the FP32
    output is kept for the backward's ``D = rowsum(dO * O)``.
    """

    @staticmethod
    def forward(ctx, q, k, v, call: _Call):
        out32, lse = call.forward(q.float(), k.float(), v.float())
        ctx.save_for_backward(q, k, v, out32, lse)
        ctx.call = call
        return out32.to(q.dtype), lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out32, lse = ctx.saved_tensors
        inputs = BackwardInputs(q, k, v, out32, lse, dout, dlse.float())
        with fp32_matmuls(q.device):
            dq, dk, dv = attention_backward(inputs, ctx.call.causal, ctx.call.spec)
        return dq, dk, dv, None


def exact_attention(q, k, v, causal: Causal = Causal()):
    """The same attention computed plainly in FP64: ``(out, lse)``, both FP64."""
    _check(q, k, v)
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float64, device=q.device)
    with torch.no_grad():
        for rows, keys, geom in causal.sequences(q, k):
            out[rows], lse[rows] = _exact_one(q[rows], k[keys], v[keys], geom)
    return out, lse


#: Query rows per FP64 block in ``exact_attention`` (bounds its memory; no effect on the result).
_EXACT_ROWS = 256


def _exact_one(q, k, v, geom: Geometry):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float64, device=q.device)
    g = geom.group
    k64, v64 = k.double(), v.double()
    for r0 in range(0, geom.seq_q, _EXACT_ROWS):
        r1 = min(geom.seq_q, r0 + _EXACT_ROWS)
        rows = torch.arange(geom.q_start + r0, geom.q_start + r1, device=q.device)
        lo = geom.first_key(geom.q_start + r0)
        hi = geom.q_start + r1  # keys past the last row are masked
        visible = geom.allowed(rows, torch.arange(lo, hi, device=q.device))  # [R, n]
        for h in range(geom.num_kv_heads):  # one KV head and its g query heads
            qh = q[r0:r1, h * g : (h + 1) * g].double().transpose(0, 1)  # [g, R, D]
            s = (qh @ k64[lo:hi, h].T * geom.softmax_scale).masked_fill_(~visible, -math.inf)  # [g, R, n]
            lse_h = torch.logsumexp(s, dim=-1)  # [g, R]
            out[r0:r1, h * g : (h + 1) * g] = (s.sub_(lse_h[..., None]).exp_() @ v64[lo:hi, h]).transpose(0, 1)
            lse[r0:r1, h * g : (h + 1) * g] = lse_h.T
    return out, lse
