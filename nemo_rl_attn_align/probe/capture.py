"""What one side's forward saw, layer by layer: the capture file both sides write and the driver reads.

Every tensor is in one layout whatever the engine: tokens first, the sequences of the batch one
after the other (``[tokens, ...]``). Per layer: ``qkv`` (the QKV projection's output, before RoPE,
as ``[all queries | all keys | all values]``),
``query`` / ``key`` / ``value`` (attention's inputs, after RoPE, ``[tokens, heads, head_dim]``),
``attention`` (core attention's output, ``[tokens, heads * head_dim]``), ``after_attention`` (the
hidden state after the output projection and the residual) and ``after_mlp`` (the layer's output).
``logprobs``: each sequence's next-token log-probabilities (``len - 1`` per sequence), one tensor.
``replayed_attention``: this side's attention run on the *reference* capture's query/key/value, one
tensor per layer (empty when this side had no reference), which is what attention's share is
measured from; ``replayed_rope``: this side's RoPE run on the reference's ``qkv`` (its query and key
per layer, ``[tokens, heads, head_dim]``; empty without a reference or where the side cannot), which
is what RoPE's share is measured from.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.vocab.errors import UsageError

FORMAT = 1
LAYER_TENSORS = ("qkv", "query", "key", "value", "attention", "after_attention", "after_mlp")


@dataclass(frozen=True)
class Capture:
    """One side's forward over ``sequences``: ``layers[i][name]`` for ``name`` in ``LAYER_TENSORS``."""

    side: str
    sequences: list[list[int]]
    layers: list[dict[str, Any]]
    logprobs: Any
    replayed_attention: list[Any] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    replayed_rope: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__}


def joined(
    spec: Any,
    per_sequence: list[list[dict[str, Any]]],
    logprobs: Any,
    replayed: list[list[Any]],
    replayed_rope: list[list[dict[str, Any]]] | None = None,
) -> Capture:
    """The capture of ``spec`` (a ``sides.SideSpec``) from its sequences' per-layer tensors, joined
    along the tokens; ``replayed`` / ``replayed_rope``: per sequence, the attention / the RoPE'd query
    and key each layer made of the reference's inputs (empty without a reference)."""
    import torch

    count = len(per_sequence[0])
    layers = [{n: torch.cat([seq[i][n] for seq in per_sequence]) for n in LAYER_TENSORS} for i in range(count)]
    joined_replays = [torch.cat([rep[i] for rep in replayed]) for i in range(count)] if replayed else []
    rope = replayed_rope or []
    joined_rope = (
        [{n: torch.cat([rep[i][n] for rep in rope]) for n in ("query", "key")} for i in range(count)] if rope else []
    )
    return Capture(spec.name, spec.sequences, layers, logprobs, joined_replays, spec.settings(), joined_rope)


def save(capture: Capture, path: Path) -> None:
    """Write ``capture`` to ``path`` (``torch.save`` of plain containers of tensors)."""
    import torch

    torch.save(capture.to_dict(), path)


def load(path: Path) -> Capture:
    """Read a capture written by ``save``; a file that is not one is a ``UsageError`` naming it."""
    import torch

    try:
        raw = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        raise UsageError(f"{path}: not a probe capture ({type(err).__name__}); write it with a probe side") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise UsageError(f"{path}: capture format {found!r}, expected {FORMAT}; capture it again with this version")
    raw.pop("format")
    capture = Capture(**raw)
    _check_layers(capture, path)
    return capture


def _check_layers(capture: Capture, path: Path) -> None:
    for i, layer in enumerate(capture.layers):
        missing = [name for name in LAYER_TENSORS if name not in layer]
        if missing:
            raise UsageError(f"{path}: layer {i} lacks {', '.join(missing)}; capture it again with a probe side")
