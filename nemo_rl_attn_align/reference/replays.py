"""Engine replays: each real engine's attention arithmetic, in the order that engine reduces.

Every function takes one sequence (``q`` ``[S, Hq, D]``, ``k``/``v`` ``[S, Hkv, D]``) and its
``Geometry`` and returns ``(out, lse)`` like ``reference_attention``; ``materializers.ENGINES``
names them, with the engine, versions and source each replays (its module docstring says how).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from nemo_rl_attn_align.reference import kernels
from nemo_rl_attn_align.reference.blocks import Geometry
from nemo_rl_attn_align.reference.plans import PagedKVCache, cp_chunks


def _arange(start: int, stop: int, device) -> torch.Tensor:
    return torch.arange(start, stop, device=device)


def _even_chunks(geom: Geometry, cp: int) -> None:
    if geom.seq_kv % (2 * cp):
        raise ValueError(f"TE context parallelism needs the sequence length ({geom.seq_kv}) divisible by 2*cp={2 * cp}")


def _te_kernel(geom: Geometry, p: dict) -> kernels.FlashKernel:
    """TE's FlashAttention-2 call: its plain forward's tile for the head dim, unless ``p["tile"]``."""
    return kernels.FlashKernel(geom.allowed, geom.softmax_scale, p["tile"] or kernels.forward_tile(geom.head_dim))


def te_p2p(q, k, v, geom: Geometry, p: dict, packed: bool):
    """The ring over ``p["cp"]`` ranks; ``packed`` selects the thd output correction (two roundings a
    step) over bshd's."""
    if geom.window is not None:
        raise ValueError("te-p2p models TE's full-causal ring only; use te-allgather for sliding-window attention")
    cp = p["cp"]
    _even_chunks(geom, cp)
    shards = cp_chunks(geom.seq_kv, cp, "load_balanced")
    kernel = _te_kernel(geom, p)
    out = torch.empty_like(q)
    lse_all = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for rank, ((a0, a1), (b0, b1)) in enumerate(shards):
        q_pos = torch.cat([_arange(a0, a1, q.device), _arange(b0, b1, q.device)])
        half = a1 - a0
        steps = []
        for i in range(cp):
            (c0, c1), (d0, d1) = shards[(rank - i) % cp]
            if i == 0:
                kv_pos, rows = torch.cat([_arange(c0, c1, q.device), _arange(d0, d1, q.device)]), slice(None)
            elif i <= rank:
                kv_pos, rows = _arange(c0, c1, q.device), slice(None)
            else:
                kv_pos, rows = torch.cat([_arange(c0, c1, q.device), _arange(d0, d1, q.device)]), slice(half, None)
            o, s = kernels.flash_forward(q[q_pos[rows]], q_pos[rows], k[kv_pos], v[kv_pos], kv_pos, kernel)
            steps.append((rows, o, s))
        lse = steps[0][2].clone()
        for rows, _, s in steps[1:]:
            lse[rows] = kernels.te_lse_merge(lse[rows], s)
        acc = te_out_correction(steps, lse, q_pos.shape[0], q.dtype, packed)
        out[q_pos], lse_all[q_pos] = acc, lse
    return out, lse_all


def te_out_correction(steps: list, lse: torch.Tensor, n_rows: int, dtype, packed: bool) -> torch.Tensor:
    """TE's forward output correction of one rank: ``steps`` ``[(rows, out_i, lse_i), ...]`` in ring
    order (``out_i`` in ``dtype``), ``lse`` the merged FP32 LSE; returns ``out`` ``[n_rows, H, D]``.

    ``packed`` (thd, ``thd_out_correction_kernel``): ``out`` starts at zero and each step adds
    ``(dtype)(float(out_i) * exp(lse_i - lse))`` in ``dtype`` (0 where ``out_i`` is 0). bshd/sbhd:
    step 0's FP32 product rounded, then each FP32 product added in place to the ``dtype`` tensor.
    """
    acc = torch.zeros(n_rows, *steps[0][1].shape[1:], dtype=dtype, device=steps[0][1].device)
    for i, (rows, o, s) in enumerate(steps):
        corrected = o * torch.exp(s - lse[rows])[..., None]  # FP32 product of a dtype out
        if packed:
            acc[rows] += torch.where(o == 0, 0.0, corrected).to(dtype)
        elif i == 0:
            acc = corrected.to(dtype)
        else:
            acc[rows] += corrected
    return acc


def te_allgather(q, k, v, geom: Geometry, p: dict):
    """TE's KV all-gather over ``p["cp"]`` ranks: one FA2 call per local chunk over the KV it sees."""
    cp = p["cp"]
    _even_chunks(geom, cp)
    chunk = geom.seq_kv // (2 * cp)
    kernel = _te_kernel(geom, p)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for rank in range(cp):
        for c in (rank, 2 * cp - 1 - rank):
            start, end = c * chunk, (c + 1) * chunk
            kv_start = 0 if geom.window is None else max(0, start - geom.window)
            out[start:end], lse[start:end] = kernels.flash_forward(
                q[start:end],
                _arange(start, end, q.device),
                k[kv_start:end],
                v[kv_start:end],
                _arange(kv_start, end, q.device),
                kernel,
            )
    return out, lse


def _fa2_splits(requested: int, geom: Geometry, n_query_rows: int, gpu: str) -> int:
    """``requested`` splits, or (0) FA2's heuristic for one sequence on ``gpu``."""
    if requested:
        return requested
    mblocks = geom.num_heads * math.ceil(n_query_rows / 64)
    return kernels.fa2_num_splits(
        mblocks, 2 * kernels.NUM_SMS[gpu], math.ceil(geom.seq_kv / kernels.split_kv_tile(geom.head_dim))
    )


def flash(q, k, v, geom: Geometry, p: dict):
    """One flash-attention 2.8 forward: ``p["splits"]`` 1 (varlen), 0 (its heuristic for ``p["gpu"]``)
    or N, tile ``p["tile"]`` (0: by head dim)."""
    pos = _arange(0, geom.seq_kv, q.device)
    splits, tile = _fa2_splits(p["splits"], geom, geom.seq_q, p["gpu"]), p["tile"]
    if splits > 1 and not tile:
        tile = kernels.split_kv_tile(geom.head_dim)
    kernel = kernels.FlashKernel(
        geom.allowed, geom.softmax_scale, tile or kernels.forward_tile(geom.head_dim), num_splits=splits
    )
    return kernels.flash_forward(q, pos[geom.q_start :], k, v, pos, kernel)


def _attend_all(device) -> Callable:
    """The mask of a non-causal call: every query row sees every KV column."""
    return lambda r, c: torch.ones(len(r), len(c), dtype=torch.bool, device=device)


def _vllm_split_args(geom: Geometry, p: dict, fa3: bool, n_queries: int, n_tiles: int) -> dict[str, Any]:
    """The split-KV arguments of vLLM's kernel call for ``n_queries`` query tokens over ``n_tiles`` KV tiles.

    FA3 (sm90) splits prefill chunks and decode alike, over the tiles each PackGQA block of 128
    (token, head) rows sees; FA2 (sm80) splits only a GQA decode step (one token, no window)."""
    g = geom.group
    if fa3:
        splits = p["splits"] or kernels.fa3_num_splits(
            geom.num_kv_heads * math.ceil(n_queries * g / 128), kernels.NUM_SMS["sm90"], n_tiles
        )
        return {"num_splits": splits, "split_visible": True, "row_block": max(1, 128 // g)}
    decode = n_queries == 1 and geom.num_heads > geom.num_kv_heads and geom.window is None
    if not decode:
        return {"num_splits": 1}
    return {
        "num_splits": p["splits"] or kernels.fa2_num_splits(geom.num_kv_heads, 2 * kernels.NUM_SMS["sm80"], n_tiles)
    }


def vllm(q, k, v, geom: Geometry, p: dict, fa3: bool):
    """vLLM's chunked prefill (then decode) over a paged cache; FA2 (sm80) or FA3 (sm90) kernels."""
    local = geom.window is not None
    tile = p["tile"] or (kernels.fa3_tile(geom.head_dim, local) if fa3 else kernels.split_kv_tile(geom.head_dim))
    prefix = p["cascade"]
    if prefix and local:
        raise ValueError("vLLM disables cascade attention for sliding-window models (use_cascade_attention)")
    cache = PagedKVCache(geom.seq_kv, p["page"], k)
    if geom.q_start:
        cache.write(0, k[: geom.q_start], v[: geom.q_start])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)

    def call(q_rows, q_pos, kv_lo, kv_hi, causal=True):
        k_c, v_c = cache.read(kv_lo, kv_hi)
        kernel = kernels.FlashKernel(
            geom.allowed if causal else _attend_all(q.device),
            geom.softmax_scale,
            tile,
            **_vllm_split_args(geom, p, fa3, len(q_pos), math.ceil((kv_hi - kv_lo) / tile)),
        )
        return kernels.flash_forward(q_rows, q_pos, k_c, v_c, _arange(kv_lo, kv_hi, q.device), kernel)

    for start in range(geom.q_start, geom.seq_kv, p["chunk"]):
        stop = min(geom.seq_kv, start + p["chunk"])
        cache.write(start, k[start:stop], v[start:stop])
        rows = slice(start - geom.q_start, stop - geom.q_start)
        q_pos = _arange(start, stop, q.device)
        if prefix and start >= prefix:  # cascade: shared prefix + own suffix
            shared = call(q[rows], q_pos, 0, prefix, causal=False)
            own = call(q[rows], q_pos, prefix, stop)
            out[rows], lse[rows] = kernels.merge_attn_states(shared, own, q.dtype)
        else:
            out[rows], lse[rows] = call(q[rows], q_pos, 0, stop)
    return out, lse
