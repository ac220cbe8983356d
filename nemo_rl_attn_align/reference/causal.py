"""Which attention the reference computes, besides its inputs: ``Causal``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.reference.blocks import Geometry


@dataclass(frozen=True)
class Causal:
    """Causal attention, optionally over a left ``window`` of tokens (FlashAttention's convention),
    with softmax ``scale`` (None: ``1/sqrt(D)``), over the packed ("thd") sequences ``cu_seqlens_q``
    / ``cu_seqlens_k`` mark (FlashAttention's varlen convention; both or neither: one sequence)."""

    window: int | None = None
    scale: float | None = None
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None

    def sequences(self, q, k) -> list[tuple[slice, slice, Geometry]]:
        """Each packed sequence of ``q`` ``[Tq, Hq, D]`` and ``k`` ``[Tk, Hkv, D]`` that has queries:
        ``(its query rows, its keys, its geometry)``."""
        if (self.cu_seqlens_q is None) != (self.cu_seqlens_k is None):
            raise ValueError("give both cu_seqlens_q and cu_seqlens_k, or neither")
        if self.cu_seqlens_q is None:
            cq, ck = [0, q.shape[0]], [0, k.shape[0]]
        else:
            cq, ck = [int(x) for x in self.cu_seqlens_q], [int(x) for x in self.cu_seqlens_k]
        if len(cq) != len(ck) or cq[0] != 0 or ck[0] != 0 or cq[-1] != q.shape[0] or ck[-1] != k.shape[0]:
            raise ValueError("cu_seqlens must start at 0, have equal lengths and end at the packed lengths")
        return [
            (slice(q0, q1), slice(k0, k1), Geometry.of(q, k, self.window, self.scale, q1 - q0, k1 - k0))
            for q0, q1, k0, k1 in zip(cq[:-1], cq[1:], ck[:-1], ck[1:], strict=True)
            if q1 > q0
        ]
