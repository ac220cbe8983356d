"""Small random attention inputs for the reference tests (fast on 2 CPU cores)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.reference.blocks import ReferenceSpec  # noqa: E402

#: Small tiles so that a ~100-token sequence spans many tiles and blocks.
SPEC = ReferenceSpec(block_q=16, block_kv=32)
DTYPES = [torch.bfloat16, torch.float16]


def make_qkv(dtype, seq_q=101, seq_kv=None, heads=4, kv_heads=2, head_dim=16, seed=0, device="cpu"):
    """``q [seq_q, heads, D]``, ``k, v [seq_kv, kv_heads, D]`` ~ N(0, 1) rounded to ``dtype``."""
    seq_kv = seq_q if seq_kv is None else seq_kv
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq_q, heads, head_dim, generator=gen)
    k = torch.randn(seq_kv, kv_heads, head_dim, generator=gen)
    v = torch.randn(seq_kv, kv_heads, head_dim, generator=gen)
    return tuple(x.to(dtype).to(device) for x in (q, k, v))


def pack(batch):
    """Sequences ``[(q, k, v), ...]`` packed as thd: ``([q, k, v], cu_seqlens_q, cu_seqlens_k)``."""
    cu_q = torch.tensor([0] + [b[0].shape[0] for b in batch]).cumsum(0)
    cu_k = torch.tensor([0] + [b[1].shape[0] for b in batch]).cumsum(0)
    return [torch.cat([b[i] for b in batch]) for i in range(3)], cu_q, cu_k


def assert_same_bits(a, b):
    """Both ``(out, lse)`` pairs are bitwise identical."""
    assert torch.equal(a[0], b[0]), f"out differs, max |d| = {(a[0].double() - b[0].double()).abs().max()}"
    assert torch.equal(a[1], b[1]), f"lse differs, max |d| = {(a[1].double() - b[1].double()).abs().max()}"
