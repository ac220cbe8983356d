"""Synthetic captures for the host-free tests: random tensors in the capture's layout, and a way to
perturb one stage of one layer (and, like a real forward, every later stage)."""

from __future__ import annotations

import torch

from nemo_rl_attn_align.probe.capture import LAYER_TENSORS, Capture

TOKENS, HEADS, KV_HEADS, HEAD_DIM = 7, 4, 2, 8
SHAPES = {
    "qkv": (TOKENS, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
    "query": (TOKENS, HEADS, HEAD_DIM),
    "key": (TOKENS, KV_HEADS, HEAD_DIM),
    "value": (TOKENS, KV_HEADS, HEAD_DIM),
    "attention": (TOKENS, HEADS * HEAD_DIM),
    "after_attention": (TOKENS, 32),
    "after_mlp": (TOKENS, 32),
}


def capture(side: str = "training", layers: int = 3, seed: int = 0) -> Capture:
    """A capture of ``layers`` random layers over one 4-token and one 3-token sequence."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [{n: torch.randn(SHAPES[n], generator=gen) for n in LAYER_TENSORS} for _ in range(layers)]
    logprobs = -torch.rand(TOKENS - 2, generator=gen) * 5
    return Capture(side, [[1, 2, 3, 4], [5, 6, 7]], tensors, logprobs)


def perturbed(base: Capture, layer: int, tensor: str, by: float, side: str = "rollout") -> Capture:
    """``base`` with ``by`` added to ``tensor`` at ``layer`` and to every tensor after it."""
    order = [(i, n) for i in range(len(base.layers)) for n in LAYER_TENSORS]
    start = order.index((layer, tensor))
    layers = [dict(t) for t in base.layers]
    for i, n in order[start:]:
        layers[i][n] = layers[i][n] + by
    return Capture(side, base.sequences, layers, base.logprobs - by, base.replayed_attention)


def with_replay(other: Capture, replayed: list[torch.Tensor]) -> Capture:
    return Capture(other.side, other.sequences, other.layers, other.logprobs, replayed, other.settings)
