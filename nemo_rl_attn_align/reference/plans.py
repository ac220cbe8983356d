"""Execution plans: which worker computes which (query tile, KV block) pair, and when.

A plan changes only *who* computes a canonical partial and *when it arrives*; the arithmetic
of each partial and the merge order live in ``blocks`` and are the same for every plan. Each plan
really moves the data the way its engine does (ring steps between CP ranks, KV in a shuffled
page pool, splits finishing last-first) so that the invariance tests exercise real data paths.

Layouts follow Transformer Engine (``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py``): with ``load_balanced`` the sequence is cut into ``2 * cp`` chunks and rank
``r`` holds chunks ``r`` and ``2cp - 1 - r`` (``get_seq_chunk_ids_for_reordering_before_attn``);
in the p2p ring rank ``r`` holds, at step ``i``, the KV of rank ``(r - i) % cp``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nemo_rl_attn_align.reference.blocks import Geometry, KVStore, QueryTiles, ReferenceSpec

LAYOUTS = ("contiguous", "load_balanced")
CP_COMMS = ("p2p", "all_gather")


def _even_split(length: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``[0, length)``, the first ``length % parts`` one longer."""
    size, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def cp_chunks(seq_len: int, cp_size: int, layout: str) -> list[list[tuple[int, int]]]:
    """Token ranges each CP rank holds: ``result[rank] = [(start, end), ...]`` in local order."""
    if cp_size < 1:
        raise ValueError(f"cp_size={cp_size} must be >= 1")
    if layout == "contiguous":
        return [[chunk] for chunk in _even_split(seq_len, cp_size)]
    if layout == "load_balanced":
        chunks = _even_split(seq_len, 2 * cp_size)
        return [[chunks[r], chunks[2 * cp_size - 1 - r]] for r in range(cp_size)]
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")


def _positions(ranges: list[tuple[int, int]]) -> list[int]:
    return [p for start, stop in ranges for p in range(start, stop)]


def _rows(q: torch.Tensor, geom: Geometry, positions: list[int]) -> torch.Tensor:
    return q[torch.tensor(positions, dtype=torch.long, device=q.device) - geom.q_start]


def _scatter(results: list[tuple[QueryTiles, tuple]], geom: Geometry, like: torch.Tensor):
    """Assemble ``(out [Sq, Hq, D], lse [Sq, Hq])`` from every worker's rows."""
    out = torch.empty(geom.seq_q, geom.num_heads, geom.head_dim, dtype=like.dtype, device=like.device)
    lse = torch.empty(geom.seq_q, geom.num_heads, dtype=torch.float32, device=like.device)
    for tiles, (o, s) in results:
        idx = torch.tensor(tiles.positions, dtype=torch.long, device=like.device) - geom.q_start
        out[idx], lse[idx] = o, s
    return out, lse


def _split_of(block: int, spec: ReferenceSpec, split_tokens: int) -> int:
    return block * spec.block_kv // split_tokens


def _feed_in_splits(tiles: QueryTiles, store: KVStore, blocks: list[int], split_tokens: int | None, spec) -> None:
    """Compute ``blocks`` grouped by KV split; deliver the splits last-first (any order would do)."""
    if split_tokens is None:
        for b in blocks:
            tiles.feed(b, *store.block(b))
        return
    by_split: dict[int, list] = {}
    for b in blocks:
        by_split.setdefault(_split_of(b, spec, split_tokens), []).append((b, tiles.partials(b, *store.block(b))))
    for split in sorted(by_split, reverse=True):
        for b, parts in by_split[split]:
            tiles.accumulate(b, parts)


def _split_tokens(kv_len: int, num_splits: int | None, split_size: int | None) -> int | None:
    if num_splits is not None and split_size is not None:
        raise ValueError("give num_splits or split_size, not both")
    if split_size is not None:
        if split_size < 1:
            raise ValueError(f"split_size={split_size} must be >= 1")
        return split_size
    if num_splits is None or num_splits == 1:
        return None
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits} must be >= 1")
    return max(1, math.ceil(kv_len / num_splits))


def _one_worker(q, k, v, geom: Geometry, spec: ReferenceSpec, split_tokens: int | None):
    """Every query row on one worker holding the whole KV, blocks grouped into splits if given."""
    store = KVStore(geom, spec, k.dtype, k.device)
    store.put(0, k, v)
    tiles = QueryTiles(q, list(range(geom.q_start, geom.seq_kv)), geom, spec)
    _feed_in_splits(tiles, store, tiles.blocks_wanted(), split_tokens, spec)
    return _scatter([(tiles, tiles.result())], geom, q)


@dataclass(frozen=True)
class SinglePass:
    """One worker, every block in ascending order: the plan the others are compared with."""

    def run(self, q, k, v, geom: Geometry, spec: ReferenceSpec):
        return _one_worker(q, k, v, geom, spec, None)


@dataclass(frozen=True)
class SplitKV:
    """KV cut into splits (``num_splits`` of them, or of ``split_size`` tokens) computed apart."""

    num_splits: int | None = None
    split_size: int | None = None

    def run(self, q, k, v, geom: Geometry, spec: ReferenceSpec):
        return _one_worker(q, k, v, geom, spec, _split_tokens(geom.seq_kv, self.num_splits, self.split_size))


@dataclass(frozen=True)
class ContextParallel:
    """Context parallelism over ``size`` ranks: p2p ring (TE's default) or KV all-gather."""

    size: int
    layout: str = "load_balanced"
    comm: str = "p2p"

    def run(self, q, k, v, geom: Geometry, spec: ReferenceSpec):
        if geom.seq_q != geom.seq_kv:
            raise ValueError("context parallelism splits a full prefill: seq_q must equal seq_kv")
        if self.comm not in CP_COMMS:
            raise ValueError(f"comm={self.comm!r} is not one of {CP_COMMS}")
        shards = cp_chunks(geom.seq_kv, self.size, self.layout)
        if self.comm == "all_gather":
            gathered = KVStore(geom, spec, k.dtype, k.device)  # every rank gathers all shards: the whole KV
            gathered.put(0, k, v)
            return _scatter([r for chunks in shards for r in _all_gather_rank(chunks, q, gathered)], geom, q)
        results = []
        for rank, chunks in enumerate(shards):
            positions = _positions(chunks)
            if positions:
                tiles = QueryTiles(_rows(q, geom, positions), positions, geom, spec)
                results.append(self._ring_rank(rank, shards, tiles, k, v))
        return _scatter(results, geom, q)

    def _ring_rank(self, rank: int, shards, tiles: QueryTiles, k, v):
        """Rank ``rank``'s query ``tiles`` fed each KV block as the ring brings its shards."""
        wanted = set(tiles.blocks_wanted())
        store = KVStore(tiles.geom, tiles.spec, k.dtype, k.device)
        for step in range(self.size):
            done = []
            for start, stop in shards[(rank - step) % self.size]:  # the KV this rank holds now
                done += store.put(start, k[start:stop], v[start:stop])
            for b in sorted(set(done) & wanted):
                tiles.feed(b, *store.block(b))
        return tiles, tiles.result()


def _all_gather_rank(chunks, q, gathered: KVStore):
    """One rank's local ``chunks`` over the ``gathered`` KV: TE runs one attention call per chunk."""
    results = []
    for start, stop in chunks:
        if stop == start:
            continue
        positions = list(range(start, stop))
        tiles = QueryTiles(_rows(q, gathered.geom, positions), positions, gathered.geom, gathered.spec)
        _feed_in_splits(tiles, gathered, tiles.blocks_wanted(), None, gathered.spec)
        results.append((tiles, tiles.result()))
    return results


class PagedKVCache:
    """A vLLM-style KV cache: a pool of pages and a per-sequence block table (pages shuffled)."""

    def __init__(self, seq_len: int, page_size: int, like: torch.Tensor, seed: int = 0):
        """Pages for ``seq_len`` tokens shaped, typed and placed like ``like``'s ``[S, Hkv, D]`` tokens."""
        if page_size < 1:
            raise ValueError(f"page_size={page_size} must be >= 1")
        self.page_size = page_size
        num_pages = max(1, math.ceil(seq_len / page_size))
        gen = torch.Generator().manual_seed(seed)
        self.block_table = torch.randperm(2 * num_pages, generator=gen, device="cpu")[:num_pages].tolist()
        shape = (2 * num_pages, page_size, *like.shape[1:])
        self.k_pages = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.v_pages = torch.zeros(shape, dtype=like.dtype, device=like.device)

    def _slots(self, start: int, stop: int):
        pos = torch.arange(start, stop, device=self.k_pages.device)
        pages = torch.tensor(self.block_table, device=pos.device)[pos // self.page_size]
        return pages, pos % self.page_size

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store tokens at positions ``[start, start + len(k))`` (vLLM's reshape_and_cache)."""
        pages, offsets = self._slots(start, start + k.shape[0])
        self.k_pages[pages, offsets] = k
        self.v_pages[pages, offsets] = v

    def read(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[start, stop)`` gathered through the block table."""
        pages, offsets = self._slots(start, stop)
        return self.k_pages[pages, offsets], self.v_pages[pages, offsets]


@dataclass(frozen=True)
class ChunkedPrefill:
    """vLLM-style chunked prefill: queries in chunks over a paged KV cache, optional KV splits.

    The first ``seq_kv - seq_q`` tokens are a cached prefix; then each chunk writes its KV into
    the pages and attends to everything cached so far (chunk size 1 is token-by-token decode).
    """

    chunk_size: int
    page_size: int = 16
    num_splits: int | None = None
    split_size: int | None = None
    seed: int = 0

    def run(self, q, k, v, geom: Geometry, spec: ReferenceSpec):
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size} must be >= 1")
        cache = PagedKVCache(geom.seq_kv, self.page_size, k, self.seed)
        if geom.q_start:
            cache.write(0, k[: geom.q_start], v[: geom.q_start])
        results = []
        for start in range(geom.q_start, geom.seq_kv, self.chunk_size):
            stop = min(geom.seq_kv, start + self.chunk_size)
            cache.write(start, k[start:stop], v[start:stop])
            positions = list(range(start, stop))
            tiles = QueryTiles(_rows(q, geom, positions), positions, geom, spec)
            store = KVStore(geom, spec, k.dtype, k.device)
            store.put(0, *cache.read(0, stop))
            split_tokens = _split_tokens(stop, self.num_splits, self.split_size)
            _feed_in_splits(tiles, store, tiles.blocks_wanted(), split_tokens, spec)
            results.append((tiles, tiles.result()))
        return _scatter(results, geom, q)
