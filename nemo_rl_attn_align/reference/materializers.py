"""Materializers: the reference's arithmetic replayed in the order each real engine uses.

Each takes one sequence (``q`` ``[S, Hq, D]``, ``k``/``v`` ``[S, Hkv, D]``, causal, optional left
window) and returns ``(out, lse)`` like ``reference_attention``. With ``canonical=True`` a
materializer keeps its decomposition (ranks, chunks, splits, pages) but computes and merges in the
canonical order, i.e. it runs the reference under the matching plan; the tests show it then equals
the reference bit for bit, so any drift figure is attributable to the engine's order alone.

Engines (sources read for each; see ``kernels`` for the FlashAttention facts):

* ``te-p2p`` -- Transformer Engine's CP p2p ring (``AttnFuncWithCPAndKVP2P.forward`` in
  ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``):
  load-balanced chunks (rank r holds chunks r and 2cp-1-r); at step i rank r attends to the KV of
  rank (r - i) % cp -- step 0 causal on both local chunks, steps i <= r all local queries against
  the first KV chunk, steps i > r the second query chunk against both KV chunks; each step is one
  flash call returning ``out`` in the input dtype and an FP32 LSE. The LSEs are merged in step
  order with ``max + log1p(exp(min - max))``; the outputs are then corrected in step order:
  ``out = (out_0 * exp(lse_0 - lse)).to(dtype)`` and ``out.add_(out_i * exp(lse_i - lse))``
  in place on that input-dtype tensor (``flash_attn_fwd_out_correction_init`` /
  ``flash_attn_fwd_out_correction``), i.e. one rounding to the input dtype per step.
* ``te-allgather`` -- TE's ``AttnFuncWithCPAndKVAllGather``: KV gathered, one flash call per local
  chunk over KV ``[max(0, c*L - W), (c+1)*L)`` (``get_kv_seq_info_after_all_gather``).
* ``flash`` -- one FlashAttention-2 forward call over the whole sequence (KV tile 64).
* ``flash-splitkv`` -- FlashAttention-2's split-KV kernel with ``splits`` splits plus its combine.
* ``vllm`` -- vLLM chunked prefill: the prompt in chunks of ``chunk`` tokens, each chunk's KV
  written to a paged cache (``page`` tokens a page) and one ``flash_attn_varlen_func`` call per
  chunk over the cached KV with ``num_splits=splits`` (``vllm/v1/attention/backends/
  flash_attn.py`` passes ``block_table`` and ``num_splits=attn_metadata.max_num_splits``).
* ``plain`` -- unfused attention in the input dtype: ``softmax(q k^T * scale) @ v`` with every
  intermediate (scores, probabilities, output) rounded to the input dtype.
* ``reference`` -- the reference itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from nemo_rl_attn_align.reference import kernels
from nemo_rl_attn_align.reference.attention import fp32_matmuls, reference_attention
from nemo_rl_attn_align.reference.blocks import Geometry, ReferenceSpec
from nemo_rl_attn_align.reference.plans import ChunkedPrefill, ContextParallel, PagedKVCache, SinglePass, SplitKV, cp_chunks


def _arange(start: int, stop: int, device) -> torch.Tensor:
    return torch.arange(start, stop, device=device)


def _even_chunks(geom: Geometry, cp: int) -> None:
    if geom.seq_kv % (2 * cp):
        raise ValueError(f"TE context parallelism needs the sequence length ({geom.seq_kv}) divisible by 2*cp={2 * cp}")


def _te_p2p(q, k, v, geom: Geometry, cp: int, tile: int):
    if geom.window is not None:
        raise ValueError("te-p2p models TE's full-causal ring only; use te-allgather for sliding-window attention")
    _even_chunks(geom, cp)
    shards = cp_chunks(geom.seq_kv, cp, "load_balanced")
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
            o, s = kernels.flash_forward(q[q_pos[rows]], q_pos[rows], k[kv_pos], v[kv_pos], kv_pos, geom.allowed,
                                         scale=geom.softmax_scale, block_n=tile)
            steps.append((rows, o, s))
        lse = steps[0][2].clone()
        for rows, _, s in steps[1:]:
            lse[rows] = kernels.te_lse_merge(lse[rows], s)
        acc = None
        for rows, o, s in steps:
            corrected = o * torch.exp(s - lse[rows])[..., None]           # FP32 product of a dtype out
            if acc is None:
                acc = corrected.to(q.dtype)
            else:
                acc[rows] += corrected                                    # in place: rounds to dtype
        out[q_pos], lse_all[q_pos] = acc, lse
    return out, lse_all


def _te_allgather(q, k, v, geom: Geometry, cp: int, tile: int):
    _even_chunks(geom, cp)
    chunk = geom.seq_kv // (2 * cp)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for rank in range(cp):
        for c in (rank, 2 * cp - 1 - rank):
            start, end = c * chunk, (c + 1) * chunk
            kv_start = 0 if geom.window is None else max(0, start - geom.window)
            kv_pos = _arange(kv_start, end, q.device)
            out[start:end], lse[start:end] = kernels.flash_forward(
                q[start:end], _arange(start, end, q.device), k[kv_start:end], v[kv_start:end], kv_pos,
                geom.allowed, scale=geom.softmax_scale, block_n=tile)
    return out, lse


def _flash(q, k, v, geom: Geometry, tile: int, splits: int = 1):
    pos = _arange(0, geom.seq_kv, q.device)
    return kernels.flash_forward(q, pos[geom.q_start:], k, v, pos, geom.allowed, scale=geom.softmax_scale,
                                 block_n=tile, num_splits=splits)


def _vllm(q, k, v, geom: Geometry, chunk: int, page: int, splits: int, tile: int):
    cache = PagedKVCache(geom.seq_kv, page, geom.num_kv_heads, geom.head_dim, k.dtype, k.device)
    if geom.q_start:
        cache.write(0, k[: geom.q_start], v[: geom.q_start])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for start in range(geom.q_start, geom.seq_kv, chunk):
        stop = min(geom.seq_kv, start + chunk)
        cache.write(start, k[start:stop], v[start:stop])
        k_c, v_c = cache.read(0, stop)
        rows = slice(start - geom.q_start, stop - geom.q_start)
        out[rows], lse[rows] = kernels.flash_forward(
            q[rows], _arange(start, stop, q.device), k_c, v_c, _arange(0, stop, q.device), geom.allowed,
            scale=geom.softmax_scale, block_n=tile, num_splits=splits)
    return out, lse


def _plain(q, k, v, geom: Geometry):
    """Scores, probabilities and output each rounded to the input dtype (FP32 accumulation inside
    each matmul, as cuBLAS computes bf16/fp16 GEMMs; this also avoids CPU half-precision GEMMs)."""
    dtype, g = q.dtype, geom.group
    visible = geom.allowed(_arange(geom.q_start, geom.seq_kv, q.device), _arange(0, geom.seq_kv, q.device))
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    scale = torch.tensor(geom.softmax_scale, dtype=dtype).float()
    for h in range(geom.num_kv_heads):                                   # one KV head and its g query heads
        qh = q[:, h * g:(h + 1) * g].transpose(0, 1).float()              # [g, S, D]
        s = (qh @ k[:, h].float().T).to(dtype)                            # [g, S, S] scores in dtype
        s = (s.float() * scale).to(dtype).masked_fill(~visible, -math.inf)
        p = torch.softmax(s.float(), dim=-1).to(dtype)                    # probabilities in dtype
        out[:, h * g:(h + 1) * g] = (p.float() @ v[:, h].float()).to(dtype).transpose(0, 1)
        lse[:, h * g:(h + 1) * g] = torch.logsumexp(s.float(), dim=-1).T
    return out, lse


@dataclass(frozen=True)
class Engine:
    """One engine's replay: its parameters with defaults, and the plan its canonical twin uses."""

    run: Callable | None
    params: dict
    plan: Callable
    summary: str


def _tile(d: dict, head_dim: int, split: bool) -> int:
    return d["tile"] or (kernels.split_kv_tile(head_dim) if split else kernels.FORWARD_TILE)


ENGINES: dict[str, Engine] = {
    "reference": Engine(None, {}, lambda p: SinglePass(), "the canonical reference"),
    "flash": Engine(lambda q, k, v, g, p: _flash(q, k, v, g, _tile(p, g.head_dim, False)),
                    {"tile": 0}, lambda p: SinglePass(), "one FlashAttention-2 forward call"),
    "flash-splitkv": Engine(lambda q, k, v, g, p: _flash(q, k, v, g, _tile(p, g.head_dim, True), p["splits"]),
                            {"splits": 4, "tile": 0}, lambda p: SplitKV(num_splits=p["splits"]),
                            "FlashAttention-2 split-KV kernel + combine"),
    "te-p2p": Engine(lambda q, k, v, g, p: _te_p2p(q, k, v, g, p["cp"], _tile(p, g.head_dim, False)),
                     {"cp": 2, "tile": 0}, lambda p: ContextParallel(p["cp"], "load_balanced", "p2p"),
                     "Transformer Engine CP p2p ring, load-balanced"),
    "te-allgather": Engine(lambda q, k, v, g, p: _te_allgather(q, k, v, g, p["cp"], _tile(p, g.head_dim, False)),
                           {"cp": 2, "tile": 0}, lambda p: ContextParallel(p["cp"], "load_balanced", "all_gather"),
                           "Transformer Engine CP KV all-gather"),
    "vllm": Engine(lambda q, k, v, g, p: _vllm(q, k, v, g, p["chunk"], p["page"], p["splits"], _tile(p, g.head_dim, True)),
                   {"chunk": 256, "page": 16, "splits": 1, "tile": 0},
                   lambda p: ChunkedPrefill(p["chunk"], p["page"], num_splits=p["splits"]),
                   "vLLM chunked prefill over paged KV (FlashAttention backend)"),
    "plain": Engine(lambda q, k, v, g, p: _plain(q, k, v, g), {}, lambda p: SinglePass(),
                    "unfused softmax attention in the input dtype"),
}


@dataclass(frozen=True)
class Materializer:
    """An engine with its parameters, e.g. ``te-p2p:cp=4``; call it like ``reference_attention``."""

    engine: str
    params: tuple = ()
    canonical: bool = False

    @property
    def options(self) -> dict:
        merged = dict(ENGINES[self.engine].params)
        merged.update(self.params)
        return merged

    @property
    def name(self) -> str:
        shown = [f"{k}={v}" for k, v in self.params]
        if self.canonical:
            shown.append("canonical=1")
        return self.engine + (":" + ",".join(shown) if shown else "")

    def __call__(self, q, k, v, *, window: int | None = None, scale: float | None = None,
                 spec: ReferenceSpec = ReferenceSpec()):
        geom = Geometry.of(q, k, window, scale, q.shape[0], k.shape[0])
        engine = ENGINES[self.engine]
        if self.canonical or engine.run is None:
            return reference_attention(q, k, v, window=window, scale=scale, plan=engine.plan(self.options), spec=spec)
        with torch.no_grad(), fp32_matmuls(q.device):
            return engine.run(q, k, v, geom, self.options)


def parse_materializer(text: str) -> Materializer:
    """``"name[:key=int,...]"`` -> ``Materializer``; ``ValueError`` naming the bad part."""
    name, _, rest = text.strip().partition(":")
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} in {text!r}; known: {', '.join(ENGINES)}")
    allowed = ENGINES[name].params
    params, canonical = [], False
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{text!r}: {item!r} is not key=integer")
        number = int(value)
        if key == "canonical":
            canonical = bool(number)
            continue
        if key not in allowed:
            known = ", ".join([*allowed, "canonical"])
            raise ValueError(f"{text!r}: {name} has no parameter {key!r} (it takes {known})")
        if number < (0 if key == "tile" else 1):
            raise ValueError(f"{text!r}: {key}={number} must be >= 1")
        params.append((key, number))
    return Materializer(name, tuple(params), canonical)
