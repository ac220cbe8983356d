"""CPU replays of the reduction structure of the GPU attention kernels the engines call.

These reproduce *which* partial sums exist, the order they are folded in and where values are
rounded to the input dtype; they do not reproduce a GPU's bits (exp2 versus exp, MMA accumulation
order inside a tile). Facts used, from flash-attention v2.8.1 (the FA2 NeMo-RL installs) and its
``hopper/`` FA3 (which vLLM's ``vllm_flash_attn`` builds for sm90):

* ``csrc/flash_attn/src/flash_fwd_kernel.h`` (``compute_attn_1rowblock`` /
  ``compute_attn_1rowblock_splitkv``): one thread block owns ``kBlockM`` query rows and walks the
  KV tiles of ``kBlockN`` tokens from the last one (``n_block_max - 1``) down to ``n_block_min``,
  keeping the running row max, row sum and an FP32 output accumulator (online softmax); ``P`` is
  converted to the input dtype (``convert_type<Element>(acc_s)``) before the ``P @ V`` GEMM; the
  epilogue divides by the row sum and writes O in the input dtype, or, in a split, FP32 ``Oaccum``
  plus its LSE. FA3 (``hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp``) has the same structure.
* FA2 tiles (``flash_fwd_launch_template.h``, ``run_mha_fwd_hdim*``): the plain forward uses
  ``kBlockN = 128`` for head dim <= 64 and 64 above (hdim 128 on sm80/sm90: 128 x 64; sm86/sm89
  causal: 64 x 64); the split-KV / paged kernel (``run_mha_fwd_splitkv_dispatch``) uses 256 for
  head dim <= 64, 128 for <= 128, else 64. FA3 tiles (``hopper/tile_size.h``,
  ``tile_size_fwd_sm90``, 16-bit inputs, causal or local, paged KV without TMA as vLLM's 16-token
  pages are): 128 for head dim <= 128, 96 for <= 192, else 80 (64 local).
* FA2 splits (``flash_api.cpp``): dense ``mha_fwd`` picks ``num_splits_heuristic(batch * heads *
  ceil(seqlen_q / 64), 2 * num_SMs, n_blocks, 128)`` itself; ``mha_varlen_fwd`` splits only in the
  decode case (``seqlenq_ngroups_swapped``: one query token, GQA, no window); a paged KV cache
  forces the split kernel (its tile) even with one split. Split ``s`` covers tiles ``[s * per,
  (s + 1) * per)`` with ``per = ceil(n_blocks / num_splits)`` counted from tile 0
  (``compute_attn_1rowblock_splitkv``). FA3 (``hopper/heuristics.h``, ``num_splits_heuristic``)
  never splits when ``n_blocks <= 4`` and splits the row block's *visible* tile range ``[n_block_min,
  n_block_max)`` (``hopper/block.h``, ``get_n_block_min_max``).
* combine (FA2 ``combine_attn_seqk_parallel``, FA3 ``flash_fwd_combine_kernel.h``): ``lse_max``
  over splits, ``lse = log(sum_s exp(lse_s - lse_max)) + lse_max``, ``O = sum_s exp(lse_s - lse) *
  Oaccum_s`` in FP32, then cast.
* with a paged KV cache the kernel still walks tiles of ``kBlockN`` tokens and only translates each
  token through the block table (``block_table_idx = n_block * kBlockN / page_block_size``), so the
  page size does not change the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nemo_rl_attn_align.reference.blocks import NEG_INF, group_heads, heads_first, ungroup_heads

#: Streaming multiprocessors per GPU generation (A100 SXM: 108; H100/H200 SXM: 132).
NUM_SMS = {"sm80": 108, "sm90": 132}


def split_kv_tile(head_dim: int) -> int:
    """``kBlockN`` of FlashAttention-2's split-KV / paged kernel for this head dim."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def forward_tile(head_dim: int) -> int:
    """``kBlockN`` of FlashAttention-2's plain forward kernel on sm80/sm90 (no dropout)."""
    return 128 if head_dim <= 64 else 64


def fa3_tile(head_dim: int, local: bool = False) -> int:
    """``kBlockN`` of FA3 on sm90 for causal/local attention over a paged (non-TMA) KV cache."""
    if head_dim <= 128:
        return 128
    if head_dim <= 192:
        return 96
    return 64 if local else 80


def _efficient_splits(
    total_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int, skip_ineligible: bool
) -> int:
    """The smallest split count within 85% of the best wave efficiency (both heuristics' core)."""
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(n):
        return not skip_ineligible or n == 1 or math.ceil(num_n_blocks / n) != math.ceil(num_n_blocks / (n - 1))

    eff = {}
    for n in range(1, max_splits + 1):
        if eligible(n):
            waves = total_mblocks * n / num_sms
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n, e in eff.items() if e >= 0.85 * best), 1)


def fa2_num_splits(batch_heads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128) -> int:
    """FA2's ``num_splits_heuristic`` (``num_sms`` is already the doubled count ``mha_fwd`` passes)."""
    if batch_heads_mblocks >= 0.8 * num_sms:
        return 1
    return _efficient_splits(batch_heads_mblocks, num_sms, num_n_blocks, max_splits, skip_ineligible=True)


def fa3_num_splits(total_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128) -> int:
    """FA3's ``num_splits_heuristic`` for causal/local attention (no L2-size split)."""
    if total_mblocks >= 0.8 * num_sms or num_n_blocks <= 4:
        return 1
    return _efficient_splits(total_mblocks, num_sms, num_n_blocks, max_splits, skip_ineligible=False)


#: Query rows processed together; numerics do not depend on it (rows never mix).
_ROW_GROUP = 128


@dataclass(frozen=True)
class FlashKernel:
    """How one FlashAttention call reduces: its mask ``allowed(rows, cols)`` on global positions, the
    softmax ``scale``, the KV tile ``block_n`` (``kBlockN``) and ``num_splits``; splits cut all tiles
    from tile 0 (FA2) or, with ``split_visible``, the tiles a block of ``row_block`` query tokens sees (FA3)."""

    allowed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scale: float
    block_n: int
    num_splits: int = 1
    split_visible: bool = False
    row_block: int | None = None


def _online_softmax(qg, kv: tuple[torch.Tensor, torch.Tensor], visible, tiles, scale, p_dtype):
    """One split's state over ``tiles`` (walked last-first) of the heads-first ``kv``: ``(m, row_sum,
    acc)`` FP32, grouped rows (``visible`` ``[R, m]``: one row per query token)."""
    kh, vh = kv
    hkv, rows, d = qg.shape
    n = visible.shape[0]
    group = rows // n
    m = torch.full((hkv, rows, 1), NEG_INF, dtype=torch.float32, device=qg.device)
    row_sum = torch.zeros_like(m)
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
        row_sum.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
        if p_dtype != torch.float32:
            p = p.to(p_dtype).to(torch.float32)  # FA rounds P to the input dtype before P @ V
        acc.mul_(alpha).baddbmm_(p, vh[:, lo:hi])
        m = m_new
    return m, row_sum, acc


def flash_forward(q, q_pos, k, v, kv_pos, kernel: FlashKernel):
    """One FlashAttention-style call: ``(out [n, Hq, D] in q.dtype, lse [n, Hq] FP32)``.

    ``q`` ``[n, Hq, D]`` at global positions ``q_pos``; ``k``/``v`` ``[m, Hkv, D]`` (the call's local
    KV, tiles counted from its first row) at global positions ``kv_pos``. With ``num_splits > 1``
    each split keeps an FP32 output and the combine kernel merges them.
    """
    block_n, num_splits = kernel.block_n, kernel.num_splits
    n, hq, _ = q.shape
    hkv = k.shape[1]
    kv = (heads_first(k), heads_first(v))
    m_len = k.shape[0]
    n_tiles = math.ceil(m_len / block_n)
    per_split = math.ceil(n_tiles / max(1, num_splits))
    out = torch.empty(n, hq, q.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.empty(n, hq, dtype=torch.float32, device=q.device)
    rows = kernel.row_block or _ROW_GROUP
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        visible = kernel.allowed(q_pos[r0:r1], kv_pos)  # [R, m]
        qg = group_heads(q[r0:r1].to(torch.float32), hkv)
        seen = [t for t in range(n_tiles) if bool(visible[:, t * block_n : (t + 1) * block_n].any())]
        if kernel.split_visible and seen:
            first, count = seen[0], seen[-1] + 1 - seen[0]
            per = math.ceil(count / max(1, num_splits))
            ranges = [range(first + s0, min(first + count, first + s0 + per)) for s0 in range(0, count, per)]
        else:
            ranges = [range(s0, min(n_tiles, s0 + per_split)) for s0 in range(0, n_tiles, per_split)]
        states = []
        for tile_range in ranges:
            tiles = [(t * block_n, min(m_len, (t + 1) * block_n)) for t in tile_range if t in seen]
            states.append(_online_softmax(qg, kv, visible, tiles, kernel.scale, q.dtype))
        o, s = _finish(states) if num_splits > 1 else _normalise(*states[0])
        out[r0:r1] = ungroup_heads(o, hq).to(q.dtype)
        lse[r0:r1] = ungroup_heads(s, hq)
    return out, lse


def _normalise(m, row_sum, acc):
    """Epilogue of one state: ``(acc / row_sum, m + log row_sum)``, squeezing the row dim of the LSE."""
    return acc / row_sum, (m + torch.log(row_sum)).squeeze(-1)


def _finish(states):
    """FlashAttention's split-KV combine over per-split FP32 ``(O, LSE)``, in split order."""
    outs, lses = [], []
    for m, row_sum, acc in states:
        empty = row_sum == 0
        outs.append(torch.where(empty, 0.0, acc / torch.where(empty, 1.0, row_sum)))
        lses.append(torch.where(empty, NEG_INF, m + torch.log(row_sum)).squeeze(-1))
    lse_max = torch.stack(lses).amax(dim=0)
    lse_max = torch.where(lse_max == NEG_INF, 0.0, lse_max)
    total = torch.zeros_like(lse_max)
    for s in lses:
        total = total + torch.exp(s - lse_max)
    lse = torch.where(total == 0, math.inf, torch.log(total) + lse_max)
    out = torch.zeros_like(outs[0])
    for o, s in zip(outs, lses, strict=True):
        out = out + torch.exp(s - lse)[..., None] * o
    return out, lse


def merge_attn_states(prefix: tuple, suffix: tuple, out_dtype):
    """vLLM's ``merge_attn_states`` (``vllm/attention/ops/triton_merge_attn_states.py``): two
    ``(out in the input dtype, lse FP32)`` partials merged in FP32, cast once: ``(out, lse)``."""
    (p_out, p_lse), (s_out, s_lse) = prefix, suffix
    lse_max = torch.maximum(p_lse, s_lse)
    p_se, s_se = torch.exp(p_lse - lse_max), torch.exp(s_lse - lse_max)
    total = p_se + s_se
    out = p_out.float() * (p_se / total)[..., None] + s_out.float() * (s_se / total)[..., None]
    return out.to(out_dtype), torch.log(total) + lse_max


def te_lse_merge(lse: torch.Tensor, lse_step: torch.Tensor) -> torch.Tensor:
    """TE's ``flash_attn_fwd_softmax_lse_correction``: ``max + log1p(exp(min - max))``."""
    hi, lo = torch.maximum(lse, lse_step), torch.minimum(lse, lse_step)
    return hi + torch.log1p(torch.exp(lo - hi))
