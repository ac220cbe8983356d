"""The canonical block arithmetic every execution plan of the reference shares.

The reference is invariant under the execution plan because of three rules, all enforced here:

1. **Fixed tiles in global coordinates.** Query rows live in tiles of ``block_q`` rows and keys in
   blocks of ``block_kv`` tokens, both indexed by the *global* token position (tile ``pos //
   block_q``, row ``pos % block_q``). A worker that owns only some rows of a tile leaves the others
   zero. Every (tile, block) partial is therefore computed by the same torch calls on tensors of
   the same shape, strides and element positions, whichever plan asked for it; since no op mixes
   rows (a GEMM's element (i, j) reads row i only, softmax reduces along a row), absent or
   zero-filled rows and masked columns cannot change a present row's bits.
2. **FP32 partials, one per (tile, block).** A partial is the online-softmax state
   ``(m, row_sum, acc)``: row max of the scaled scores, sum of ``exp(s - m)`` and the unnormalised
   ``exp(s - m) @ V``, all in FP32. Nothing is rounded to the input dtype until the very end.
3. **Merge in global block-index order.** Partials may arrive in any order (ring steps, splits,
   chunks); ``TileAccumulator`` holds early ones back and folds them left to right by block index
   with the online-softmax rule. A block that has no visible key for a row is an exact no-op for
   that row (``acc * 1 + 0``), so a plan may skip it or not.

Shapes (one sequence): ``q`` is ``[Sq, Hq, D]``, ``k``/``v`` are ``[Skv, Hkv, D]`` with ``Hq = g * Hkv``
(query head ``h`` reads KV head ``h // g``). Queries are bottom-right aligned: query ``i`` sits at
position ``Skv - Sq + i``. The mask is causal with an optional left window ``W`` in the
FlashAttention/Megatron convention: position ``i`` sees keys ``j`` with ``i - W <= j <= i``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class ReferenceSpec:
    """The canonical tiling; part of the reference's definition (two specs give different bits)."""

    block_q: int = 128
    block_kv: int = 128

    def __post_init__(self):
        for name in ("block_q", "block_kv"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ReferenceSpec.{name}={value!r} must be a positive int")


@dataclass(frozen=True)
class Geometry:
    """Where one sequence's queries and keys sit, and which keys each query may see."""

    seq_q: int
    seq_kv: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None = None
    scale: float | None = None

    @classmethod
    def of(cls, q, k, window: int | None, scale: float | None, seq_q: int, seq_kv: int) -> Geometry:
        """The geometry of one sequence of the packed ``q`` ``[Tq, Hq, D]`` / ``k`` ``[Tk, Hkv, D]``."""
        return cls(seq_q, seq_kv, q.shape[1], k.shape[1], q.shape[2], window, scale)

    def __post_init__(self):
        if self.seq_q > self.seq_kv:
            raise ValueError(f"seq_q={self.seq_q} > seq_kv={self.seq_kv}: queries must have their keys")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.window is not None and self.window < 0:
            raise ValueError(f"window={self.window} must be >= 0 or None")

    @property
    def q_start(self) -> int:
        """Global position of query row 0."""
        return self.seq_kv - self.seq_q

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def first_key(self, pos: int) -> int:
        """Smallest key position query ``pos`` sees."""
        return 0 if self.window is None else max(0, pos - self.window)

    def allowed(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Boolean ``[len(rows), len(cols)]``: True where query position row sees key position col."""
        r, c = rows[:, None], cols[None, :]
        ok = (c <= r) & (c < self.seq_kv)
        if self.window is not None:
            ok &= c >= r - self.window
        return ok


def tile_block_mask(geom: Geometry, spec: ReferenceSpec, tile: int, block: int, device=None) -> torch.Tensor | None:
    """Masked entries (True) of the full (tile, block) square on ``device``, or None when nothing is masked.

    Decided from the tile and block indices alone, never from which rows a plan holds.
    """
    bq, bk = spec.block_q, spec.block_kv
    row_lo, row_hi = tile * bq, tile * bq + bq - 1
    col_lo, col_hi = block * bk, block * bk + bk - 1
    inside = col_hi <= row_lo and col_hi < geom.seq_kv
    if geom.window is not None:
        inside = inside and col_lo >= row_hi - geom.window
    if inside:
        return None
    rows = torch.arange(row_lo, row_hi + 1, device=device)
    cols = torch.arange(col_lo, col_hi + 1, device=device)
    return ~geom.allowed(rows, cols)


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[n, H, D]`` -> FP32 ``[H, n, D]``."""
    return x.to(torch.float32).transpose(0, 1).contiguous()


def group_heads(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[n, Hq, *tail]`` -> ``[Hkv, g*n, *tail]``: query head ``h`` goes with KV head ``h // g``."""
    n, hq, *tail = x.shape
    g = hq // num_kv_heads
    return (
        x.view(n, num_kv_heads, g, *tail).permute(1, 2, 0, *range(3, 3 + len(tail))).reshape(num_kv_heads, g * n, *tail)
    )


def ungroup_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[Hkv, g*n, *tail]`` -> ``[n, Hq, *tail]``, the inverse of ``group_heads``."""
    hkv, rows, *tail = x.shape
    g = num_heads // hkv
    return (
        x.view(hkv, g, rows // g, *tail).permute(2, 0, 1, *range(3, 3 + len(tail))).reshape(rows // g, num_heads, *tail)
    )


def tile_rows(positions: list[int], spec: ReferenceSpec) -> dict[int, tuple[list[int], list[int]]]:
    """``{tile: (indices into positions, offsets inside the tile)}``, tiles ascending."""
    tiles: dict[int, tuple[list[int], list[int]]] = {}
    for idx, pos in enumerate(positions):
        tiles.setdefault(pos // spec.block_q, ([], []))
        tiles[pos // spec.block_q][0].append(idx)
        tiles[pos // spec.block_q][1].append(pos % spec.block_q)
    return dict(sorted(tiles.items()))


def canonical_tile(
    rows: torch.Tensor, offsets: list[int], geom: Geometry, spec: ReferenceSpec, fill: float = 0.0
) -> torch.Tensor:
    """FP32 tile ``[Hkv, g*BQ, *tail]`` with ``rows`` ``[n, Hq, *tail]`` at ``offsets``, ``fill`` elsewhere."""
    buf = torch.full((spec.block_q, *rows.shape[1:]), fill, dtype=torch.float32, device=rows.device)
    buf[offsets] = rows.to(torch.float32)
    return group_heads(buf, geom.num_kv_heads).contiguous()


def tile_blocks(geom: Geometry, spec: ReferenceSpec, positions: list[int]) -> range:
    """The KV blocks holding some key that one of the query ``positions`` (of one tile) sees."""
    return range(geom.first_key(min(positions)) // spec.block_kv, max(positions) // spec.block_kv + 1)


def pair_scores(
    qt: torch.Tensor, kb: torch.Tensor, mask: torch.Tensor | None, scale: float, group: int
) -> torch.Tensor:
    """Scaled FP32 scores ``[Hkv, g*BQ, BK]`` of one (tile, block) pair, ``-inf`` where masked.

    qt ``[Hkv, g*BQ, D]``, kb ``[Hkv, BK, D]`` (FP32), mask ``[BQ, BK]`` (True = masked) or None.
    """
    hkv, rows, _ = qt.shape
    s = torch.baddbmm(qt.new_empty(()), qt, kb.transpose(1, 2), beta=0.0, alpha=scale)
    if mask is not None:
        s.view(hkv, group, rows // group, -1).masked_fill_(mask, NEG_INF)
    return s


def pair_partial(
    qt: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, mask: torch.Tensor | None, scale: float, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP32 online-softmax state of one (tile, block) pair (shapes as in ``pair_scores``, vb like kb).

    Returns m, row_sum ``[Hkv, g*BQ, 1]`` and acc ``[Hkv, g*BQ, D]``; a row with no visible key has
    m = -inf, row_sum = 0, acc = 0.
    """
    s = pair_scores(qt, kb, mask, scale, group)  # [Hkv, g*BQ, BK]
    m = s.amax(dim=-1, keepdim=True)  # [Hkv, g*BQ, 1]
    m_safe = torch.where(m == NEG_INF, 0.0, m) if mask is not None else m
    p = s.sub_(m_safe).exp_()  # in place: s becomes p
    row_sum = p.sum(dim=-1, keepdim=True)
    acc = torch.bmm(p, vb)  # [Hkv, g*BQ, D]
    return m, row_sum, acc


def merge_into(state: list, part: tuple) -> None:
    """Fold ``part`` into ``state`` ([m, row_sum, acc], updated in place) by the online-softmax rule."""
    m, row_sum, acc = state
    m_b, row_sum_b, acc_b = part
    m_new = torch.maximum(m, m_b)
    m_ref = torch.where(m_new == NEG_INF, 0.0, m_new)
    a = torch.exp(m - m_ref)
    b = torch.exp(m_b - m_ref)
    acc.mul_(a).addcmul_(acc_b, b)
    row_sum.mul_(a).addcmul_(row_sum_b, b)
    state[0] = m_new


class TileAccumulator:
    """Merges one tile's partials in ascending block order, whatever order they arrive in."""

    def __init__(self, blocks: Iterable[int]):
        self.expected = sorted(blocks)
        self._next = 0
        self._pending: dict[int, tuple] = {}
        self.state: list | None = None

    def add(self, block: int, part: tuple) -> None:
        if block in self._pending or block not in self.expected[self._next :]:
            raise RuntimeError(f"block {block} delivered twice or not expected (expected {self.expected})")
        self._pending[block] = part
        while self._next < len(self.expected) and self.expected[self._next] in self._pending:
            part = self._pending.pop(self.expected[self._next])
            if self.state is None:
                self.state = list(part)
            else:
                merge_into(self.state, part)
            self._next += 1

    @property
    def done(self) -> bool:
        return self._next == len(self.expected)


class QueryTiles:
    """The query rows one worker owns for one sequence, laid out in canonical tiles.

    ``positions`` are global query positions (ascending); ``q_rows`` is ``[n, Hq, D]``.
    """

    def __init__(self, q_rows: torch.Tensor, positions: list[int], geom: Geometry, spec: ReferenceSpec):
        self.geom, self.spec = geom, spec
        self.positions = list(positions)
        self.dtype = q_rows.dtype
        self.tiles: dict[int, dict] = {}
        for t, (idx, off) in tile_rows(self.positions, spec).items():
            self.tiles[t] = {
                "idx": idx,
                "off": off,
                "q": canonical_tile(q_rows[idx], off, geom, spec),
                "acc": TileAccumulator(tile_blocks(geom, spec, [t * spec.block_q + o for o in off])),
            }

    def blocks_wanted(self) -> list[int]:
        """Every KV block some tile still needs, ascending."""
        return sorted({b for tile in self.tiles.values() for b in tile["acc"].expected})

    def partials(self, block: int, kb: torch.Tensor, vb: torch.Tensor) -> dict[int, tuple]:
        """Partials of ``block`` for every tile that wants it: ``{tile: (m, row_sum, acc)}``."""
        out = {}
        for t, tile in self.tiles.items():
            if block in tile["acc"].expected:
                mask = tile_block_mask(self.geom, self.spec, t, block, kb.device)
                out[t] = pair_partial(tile["q"], kb, vb, mask, self.geom.softmax_scale, self.geom.group)
        return out

    def accumulate(self, block: int, parts: dict[int, tuple]) -> None:
        for t, part in parts.items():
            self.tiles[t]["acc"].add(block, part)

    def feed(self, block: int, kb: torch.Tensor, vb: torch.Tensor) -> None:
        """Compute and merge ``block`` for every tile that wants it."""
        self.accumulate(block, self.partials(block, kb, vb))

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [n, Hq, D] in the input dtype, lse [n, Hq] FP32)``, downcast once, here."""
        geom = self.geom
        n = len(self.positions)
        out = torch.empty(n, geom.num_heads, geom.head_dim, dtype=self.dtype, device=self._device())
        lse = torch.empty(n, geom.num_heads, dtype=torch.float32, device=out.device)
        for t, tile in self.tiles.items():
            acc = tile["acc"]
            if not acc.done:
                raise RuntimeError(f"tile {t}: blocks {acc.expected[acc._next :]} never delivered by the plan")
            m, row_sum, a = acc.state
            o = ungroup_heads(a / row_sum, geom.num_heads)  # [BQ, Hq, D]
            s = ungroup_heads((m + torch.log(row_sum)).squeeze(-1), geom.num_heads)  # [BQ, Hq]
            out[tile["idx"]] = o[tile["off"]].to(self.dtype)
            lse[tile["idx"]] = s[tile["off"]]
        return out, lse

    def _device(self):
        return next(iter(self.tiles.values()))["q"].device


class KVStore:
    """Key/value tokens a worker has received, kept in canonical blocks (zero where absent)."""

    def __init__(self, geom: Geometry, spec: ReferenceSpec, dtype: torch.dtype, device):
        self.geom, self.spec, self.dtype, self.device = geom, spec, dtype, device
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        self._filled: dict[int, int] = {}

    def put(self, start: int, k: torch.Tensor, v: torch.Tensor) -> list[int]:
        """Store tokens at positions ``[start, start + len(k))``; return the blocks now complete."""
        bk, done = self.spec.block_kv, []
        pos, end = start, start + k.shape[0]
        while pos < end:
            b = pos // bk
            stop = min(end, (b + 1) * bk)
            if b not in self._k:
                shape = (bk, self.geom.num_kv_heads, self.geom.head_dim)
                self._k[b] = torch.zeros(shape, dtype=self.dtype, device=self.device)
                self._v[b] = torch.zeros(shape, dtype=self.dtype, device=self.device)
                self._filled[b] = 0
            self._k[b][pos - b * bk : stop - b * bk] = k[pos - start : stop - start]
            self._v[b][pos - b * bk : stop - b * bk] = v[pos - start : stop - start]
            self._filled[b] += stop - pos
            if self.complete(b):
                done.append(b)
            pos = stop
        return done

    def tokens_in(self, block: int) -> int:
        """Tokens block ``block`` holds once complete (the last block may be short)."""
        bk = self.spec.block_kv
        return max(0, min(bk, self.geom.seq_kv - block * bk))

    def complete(self, block: int) -> bool:
        return self._filled.get(block, 0) == self.tokens_in(block)

    def block(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` of ``block`` as FP32 ``[Hkv, BK, D]``."""
        return heads_first(self._k[block]), heads_first(self._v[block])
