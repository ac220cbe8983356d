"""The reference attention's backward: FlashAttention-2's recompute scheme in one canonical order.

For each sequence and each (query tile, KV block) pair of ``blocks`` (same tiles, same masks, same
score arithmetic as the forward), all in FP32:

    S  = scale * Q K^T  (masked)            P  = exp(S - lse)   from the forward's FP32 lse
    dV_b += P^T dO                          dP = dO V^T
    dS = P * (dP - D)                       dQ_t += dS K        dK_b += dS^T Q

with ``D = rowsum(dO * O) - dlse`` per query row: ``O`` is the forward's FP32 output before its
one rounding (FlashAttention uses the rounded O; the unrounded one keeps the error at one ulp) and
``dlse`` the gradient reaching ``lse`` (``d lse_i / d S_ij = P_ij``), zero when lse is unused. The
softmax scale multiplies dQ and dK once at the end, then each gradient is rounded once to the
input dtype.

**Canonical order.** KV blocks are walked in ascending index (FlashAttention-2's backward: one
block owns its dK/dV); for each, the query tiles that see it in ascending index. So dQ of a tile
sums its blocks in ascending block order and dK/dV of a block sum its tiles in ascending tile
order. A GQA group's ``g`` query heads are the ``g*BQ`` rows of one tile (``group_heads``), summed
inside the same GEMM, always of the same shape. Rows a tile does not hold (outside the sequence's
queries) get ``q = dO = 0`` and ``lse = +inf``, hence ``P = 0`` and exact-zero contributions.

**Invariance.** The backward reads only ``q, k, v``, the forward's ``O`` and ``lse`` (whose bits do
not depend on the forward's plan) and the incoming gradients, one sequence at a time at that
sequence's own positions: its result is the same bits for every forward plan, every batch makeup
and every run.

**Accuracy** (checked against autograd through FP64 attention by ``tests/reference/test_backward.py``).
With the same rounded inputs and ``dO``, every element of dq, dk and dv is within

    ulp(dtype, g64) + 2**-14 * A

of the FP64 gradient ``g64``, where ``A`` is the magnitude the FP32 errors scale with: the same
gradient computed from absolute values, ``A_dV = P^T |dO|``, ``A_dQ = scale * (P * C) |K|``,
``A_dK = scale * (P * C)^T |Q|`` with ``C_ij = |dO_i|.|V_j| + |dO_i|.|O_i| + |dlse_i|``.
Why: each FP32 product and sum of ``n`` terms errs by at most about ``n * 2**-24`` of the sum of
its terms' magnitudes (n is the head dim or the sequence length, at most a few hundred here), and
P's relative error is about ``2**-20 * (2 + |S| + |lse|)`` (the forward's lse bound), so the FP32
gradient is within ``2**-14 * A`` of ``g64``; the final rounding to the nearest (or, with that
error, the neighbouring) value of the input dtype adds at most one ulp. For FP32 inputs the ulp
term is negligible and the bound is the ``2**-14 * A`` term. ``A`` is a few times ``|g|`` for
ordinary inputs, so in practice every element is within one ulp of the input dtype
(``2**-7`` relative for bf16, ``2**-10`` for fp16) of the exact gradient.

Shapes (one sequence): q, dO, O ``[Sq, Hq, D]``, lse, dlse ``[Sq, Hq]``, k, v ``[Skv, Hkv, D]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nemo_rl_attn_align.reference.blocks import (
    Geometry,
    KVStore,
    ReferenceSpec,
    canonical_tile,
    pair_scores,
    tile_block_mask,
    tile_blocks,
    tile_rows,
    ungroup_heads,
)
from nemo_rl_attn_align.reference.causal import Causal


@dataclass(frozen=True)
class BackwardInputs:
    """What the backward reads: the inputs ``q``/``k``/``v``, the forward's FP32 ``out`` ``[Tq, Hq, D]``
    and ``lse`` ``[Tq, Hq]``, and the incoming gradients ``dout``/``dlse``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    dout: torch.Tensor
    dlse: torch.Tensor

    def sequence(self, rows: slice, keys: slice) -> BackwardInputs:
        """The inputs of one packed sequence: its query ``rows`` and its ``keys``."""
        return BackwardInputs(
            self.q[rows], self.k[keys], self.v[keys], self.out[rows], self.lse[rows], self.dout[rows], self.dlse[rows]
        )


def attention_backward(inputs: BackwardInputs, causal: Causal, spec: ReferenceSpec):
    """``(dq [Tq, Hq, D], dk, dv [Tk, Hkv, D])`` in the input dtype, for ``causal``'s packed sequences."""
    dq, dk, dv = torch.zeros_like(inputs.q), torch.zeros_like(inputs.k), torch.zeros_like(inputs.v)
    for rows, keys, geom in causal.sequences(inputs.q, inputs.k):  # a sequence without queries: zero for its keys
        dq[rows], dk[keys], dv[keys] = _sequence_backward(inputs.sequence(rows, keys), geom, spec)
    return dq, dk, dv


class _Tile:
    """One query tile's FP32 operands (``[Hkv, g*BQ, ...]``) and its dQ accumulator."""

    def __init__(
        self, t: int, idx: list[int], off: list[int], geom: Geometry, spec: ReferenceSpec, seq: BackwardInputs
    ):
        def tile(x, fill=0.0):
            return canonical_tile(x[idx], off, geom, spec, fill)

        self.idx, self.off = idx, off
        self.blocks = tile_blocks(geom, spec, [t * spec.block_q + o for o in off])
        self.q, self.dout = tile(seq.q), tile(seq.dout)  # [Hkv, g*BQ, D]
        self.lse = tile(seq.lse, math.inf)[..., None]  # [Hkv, g*BQ, 1]
        self.delta = (self.dout * tile(seq.out)).sum(-1, keepdim=True) - tile(seq.dlse)[..., None]  # D - dlse
        self.dq = torch.zeros_like(self.q)


def _sequence_backward(seq: BackwardInputs, geom: Geometry, spec: ReferenceSpec):
    """One sequence's ``(dq [Sq, Hq, D], dk, dv [Skv, Hkv, D])``, input dtype."""
    q, k, v = seq.q, seq.k, seq.v
    positions = list(range(geom.q_start, geom.seq_kv))
    tiles = {
        t: _Tile(t, idx, off, geom, spec, seq) for t, (idx, off) in tile_rows(positions, spec).items()
    }  # ascending tiles
    store = KVStore(geom, spec, k.dtype, k.device)
    store.put(0, k, v)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    scale, bk = geom.softmax_scale, spec.block_kv
    for b in sorted({b for tile in tiles.values() for b in tile.blocks}):  # ascending blocks
        kb, vb = store.block(b)  # [Hkv, BK, D]
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        for t, tile in tiles.items():
            if b not in tile.blocks:
                continue
            s = pair_scores(
                tile.q, kb, tile_block_mask(geom, spec, t, b, kb.device), scale, geom.group
            )  # [Hkv, g*BQ, BK]
            p = s.sub_(tile.lse).exp_()  # P, in place of S
            dvb.baddbmm_(p.transpose(1, 2), tile.dout)  # dV_b += P^T dO
            ds = p.mul_(torch.bmm(tile.dout, vb.transpose(1, 2)).sub_(tile.delta))  # dS = P (dP - D)
            tile.dq.baddbmm_(ds, kb)  # dQ_t += dS K
            dkb.baddbmm_(ds.transpose(1, 2), tile.q)  # dK_b += dS^T Q
        n = store.tokens_in(b)
        dk[b * bk : b * bk + n] = dkb.mul_(scale).transpose(0, 1)[:n].to(k.dtype)  # [BK, Hkv, D] -> tokens
        dv[b * bk : b * bk + n] = dvb.transpose(0, 1)[:n].to(v.dtype)
    dq = torch.empty_like(q)
    for tile in tiles.values():
        dq[tile.idx] = ungroup_heads(tile.dq.mul_(scale), geom.num_heads)[tile.off].to(q.dtype)
    return dq, dk, dv
