"""CPU replays of the reduction structure of the GPU attention kernels the engines call.

These reproduce *which* partial sums exist, the order they are folded in and where values are
rounded to the input dtype; they do not reproduce a GPU's bits (exp2 versus exp, MMA accumulation
order inside a tile). Facts used, from FlashAttention-2 ``csrc/flash_attn/src``:

* ``flash_fwd_kernel.h`` (``compute_attn_1rowblock`` / ``compute_attn_1rowblock_splitkv``): one
  thread block owns ``kBlockM`` query rows and walks the KV tiles of ``kBlockN`` tokens from the
  last one (``n_block_max - 1``) down to ``n_block_min``, keeping the running row max, row sum and
  an FP32 output accumulator (online softmax); ``P`` is converted to the input dtype
  (``convert_type<Element>(acc_s)``) before the ``P @ V`` GEMM; the epilogue divides by the row
  sum and writes O in the input dtype, or, in a split, FP32 ``Oaccum`` plus its LSE.
* split-KV: ``n_blocks_per_split = ceil(ceil(seqlen_k / kBlockN) / num_splits)``, split ``s``
  covers tiles ``[s * n_blocks_per_split, (s + 1) * n_blocks_per_split)``;
  ``combine_attn_seqk_parallel`` takes ``lse_max`` over splits, ``lse_logsum = log(sum_s
  exp(lse_s - lse_max)) + lse_max`` and ``O = sum_s exp(lse_s - lse_logsum) * Oaccum_s`` in FP32,
  then casts.
* tile sizes (``flash_fwd_launch_template.h``): the split/paged kernel uses ``kBlockN = 256`` for
  head dim <= 64, 128 for <= 128, else 64; the plain forward for head dim 128 on sm80/sm90 uses
  ``kBlockM = 128, kBlockN = 64``.
* with a paged KV cache the kernel still walks tiles of ``kBlockN`` tokens and only translates each
  token through the block table (``block_table_idx = n_block * kBlockN / page_block_size``), so the
  page size does not change the arithmetic.
"""

from __future__ import annotations

import math

import torch

from nemo_rl_attn_align.reference.blocks import NEG_INF, group_heads, ungroup_heads


def split_kv_tile(head_dim: int) -> int:
    """``kBlockN`` of FlashAttention-2's split-KV / paged kernel for this head dim."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


#: ``kBlockN`` of FlashAttention-2's plain forward kernel (head dim 128, sm80/sm90).
FORWARD_TILE = 64

#: Query rows processed together; numerics do not depend on it (rows never mix).
_ROW_GROUP = 128


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[n, H, D]`` -> FP32 ``[H, n, D]``."""
    return x.to(torch.float32).transpose(0, 1).contiguous()


def _online_softmax(qg, kh, vh, visible, tiles, scale, group, p_dtype):
    """One split's state over ``tiles`` (walked last-first): ``(m, l, acc)`` FP32, grouped rows."""
    hkv, rows, d = qg.shape
    n = rows // group
    m = torch.full((hkv, rows, 1), NEG_INF, dtype=torch.float32, device=qg.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(hkv, rows, d, dtype=torch.float32, device=qg.device)
    for lo, hi in reversed(tiles):
        s = torch.baddbmm(qg.new_empty(()), qg, kh[:, lo:hi].transpose(1, 2), beta=0.0, alpha=scale)
        vis = visible[:, lo:hi]
        if not bool(vis.all()):
            s.view(hkv, group, n, hi - lo).masked_fill_(~vis, NEG_INF)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_ref = torch.where(m_new == NEG_INF, 0.0, m_new)
        alpha = torch.exp(m - m_ref)
        p = s.sub_(m_ref).exp_()
        l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
        if p_dtype != torch.float32:
            p = p.to(p_dtype).to(torch.float32)          # FA rounds P to the input dtype before P @ V
        acc.mul_(alpha).baddbmm_(p, vh[:, lo:hi])
        m = m_new
    return m, l, acc


def flash_forward(q, q_pos, k, v, kv_pos, allowed, *, scale, block_n, num_splits=1, out_dtype=None):
    """One FlashAttention-style call: ``(out [n, Hq, D], lse [n, Hq] FP32)``.

    ``q`` ``[n, Hq, D]`` at global positions ``q_pos``; ``k``/``v`` ``[m, Hkv, D]`` (the call's local
    KV, tiles counted from its first row) at global positions ``kv_pos``; ``allowed(rows, cols)``
    is the mask on global positions. ``out_dtype`` defaults to the input dtype; with
    ``num_splits > 1`` each split keeps an FP32 output and the combine kernel merges them.
    """
    out_dtype = q.dtype if out_dtype is None else out_dtype
    n, hq, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    kh, vh = _heads_first(k), _heads_first(v)
    m_len = k.shape[0]
    n_tiles = math.ceil(m_len / block_n)
    per_split = math.ceil(n_tiles / max(1, num_splits))
    out = torch.empty(n, hq, q.shape[2], dtype=out_dtype, device=q.device)
    lse = torch.empty(n, hq, dtype=torch.float32, device=q.device)
    for r0 in range(0, n, _ROW_GROUP):
        r1 = min(n, r0 + _ROW_GROUP)
        visible = allowed(q_pos[r0:r1], kv_pos)                               # [R, m]
        qg = group_heads(q[r0:r1].to(torch.float32), hkv)
        states = []
        for s0 in range(0, n_tiles, per_split):
            tiles = [(t * block_n, min(m_len, (t + 1) * block_n)) for t in range(s0, min(n_tiles, s0 + per_split))]
            tiles = [(lo, hi) for lo, hi in tiles if bool(visible[:, lo:hi].any())]
            states.append(_online_softmax(qg, kh, vh, visible, tiles, scale, group, q.dtype))
        o, s = _finish(states) if num_splits > 1 else _normalise(*states[0])
        out[r0:r1] = ungroup_heads(o, hq).to(out_dtype)
        lse[r0:r1] = ungroup_heads(s, hq)
    return out, lse


def _normalise(m, l, acc):
    """Epilogue of one state: ``(acc / l, m + log l)``, squeezing the row dim of the LSE."""
    return acc / l, (m + torch.log(l)).squeeze(-1)


def _finish(states):
    """FlashAttention's split-KV combine over per-split FP32 ``(O, LSE)``, in split order."""
    outs, lses = [], []
    for m, l, acc in states:
        empty = l == 0
        outs.append(torch.where(empty, 0.0, acc / torch.where(empty, 1.0, l)))
        lses.append(torch.where(empty, NEG_INF, m + torch.log(l)).squeeze(-1))
    lse_max = torch.stack(lses).amax(dim=0)
    lse_max = torch.where(lse_max == NEG_INF, 0.0, lse_max)
    total = torch.zeros_like(lse_max)
    for s in lses:
        total = total + torch.exp(s - lse_max)
    lse = torch.where(total == 0, math.inf, torch.log(total) + lse_max)
    out = torch.zeros_like(outs[0])
    for o, s in zip(outs, lses):
        out = out + torch.exp(s - lse)[..., None] * o
    return out, lse


def te_lse_merge(lse: torch.Tensor, lse_step: torch.Tensor) -> torch.Tensor:
    """TE's ``flash_attn_fwd_softmax_lse_correction``: ``max + log1p(exp(min - max))``."""
    hi, lo = torch.maximum(lse, lse_step), torch.minimum(lse, lse_step)
    return hi + torch.log1p(torch.exp(lo - hi))
