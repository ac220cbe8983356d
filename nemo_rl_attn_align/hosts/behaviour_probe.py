"""A rotary embedding's behaviour (``vocab.behaviour`` rope kind), measured by evaluating it.

Both sides' readers (``hosts.megatron_behaviour``, the vLLM reader) hand ``rotation_kind`` a function
that applies exactly what their attention layer applies to its query; it is evaluated on the
``head_dim`` one-hot basis vectors at each position, in float32 on the module's device, and the image
of each channel gives its rotated partner, the angle and the magnitude. Torch only, no host import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from nemo_rl_attn_align.vocab.behaviour import per_layer, rope

#: ``apply(basis, positions) -> images``: ``basis`` is ``[len(positions), head_dim, head_dim]`` float32
#: (``basis[k]`` the identity: row ``a`` is the one-hot vector of channel ``a``, a token at position
#: ``positions[k]``); ``images[k, a]`` is what the layer's rotary makes of row ``a`` at that position.
Apply = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]

#: An off-pair component above this share of the largest one is not a plane rotation.
_OFF_PAIR = 1e-4


class NotARotation(ValueError):
    """The evaluated map is not a rotation of channel pairs (the reader reports the field unobservable)."""


def no_rotation(head_dim: int, positions: Sequence[int]) -> dict[str, Any]:
    """The rope kind of a layer without rotary embedding (NoPE): no pairs."""
    return {"head_dim": head_dim, "pairs": [], "angles": [[] for _ in positions], "scales": []}


def rotation_kind(apply: Apply, head_dim: int, positions: Sequence[int], device: Any = "cpu") -> dict[str, Any]:
    """The rope kind of ``apply`` (``vocab.behaviour``): pairs, angles per position, scales at position 1
    (the first position where 1 is not evaluated). ``NotARotation`` where the map is not one."""
    positions = list(positions)
    basis = torch.eye(head_dim, dtype=torch.float32, device=device).expand(len(positions), head_dim, head_dim)
    images = apply(basis.contiguous(), positions)
    if tuple(images.shape) != (len(positions), head_dim, head_dim):
        raise NotARotation(f"the rotary gave shape {tuple(images.shape)} for {len(positions)}x{head_dim}x{head_dim}")
    images = images.detach().to(device="cpu", dtype=torch.float32)
    pairs = _pairs(images)
    a, b = (torch.tensor([p[i] for p in pairs], dtype=torch.long) for i in (0, 1))
    cosines, sines = images[:, a, a], images[:, a, b]
    angles = torch.atan2(sines, cosines)
    angles = torch.where(angles <= -math.pi, angles + 2 * math.pi, angles)  # (-pi, pi]
    at = positions.index(1) if 1 in positions else 0
    scales = torch.hypot(cosines[at], sines[at])
    return {"head_dim": head_dim, "pairs": pairs, "angles": angles.tolist(), "scales": scales.tolist()}


def _pairs(images: torch.Tensor) -> list[list[int]]:
    """The channel pairs the map rotates together, ``[a, b]`` with ``a < b`` (the cosine side), by ``a``;
    channels it leaves as they are are in no pair."""
    head_dim = images.shape[-1]
    eye = torch.eye(head_dim, dtype=torch.bool)
    off = images.masked_fill(eye, 0.0).abs().amax(dim=0)  # [channel, image component]
    largest = float(images.abs().max()) or 1.0
    moved = off.amax(dim=1) > 0
    partner = off.argmax(dim=1)
    pairs = []
    for a in range(head_dim):
        if not moved[a]:
            continue
        b = int(partner[a])
        if not moved[b] or int(partner[b]) != a:
            raise NotARotation(f"channel {a} moves into {b}, but {b} does not move into {a}")
        stray = off[a].clone()
        stray[b] = 0.0
        if float(stray.max()) > _OFF_PAIR * largest:
            raise NotARotation(f"channel {a} moves into more than one channel")
        if a < b:
            pairs.append([a, b])
    return pairs


def rope_value(kinds_by_layer: Mapping[int, Mapping[str, Any]], positions: Sequence[int]) -> dict[str, Any]:
    """The checked ``rope`` contract value of layer index -> rope kind, evaluated at ``positions``."""
    return rope({"positions": list(positions), **per_layer(kinds_by_layer)}, "rope")
