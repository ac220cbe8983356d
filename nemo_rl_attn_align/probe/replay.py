"""The replay estimate beside the measured share: each side's attention replayed (``reference/``'s
materializers, the engines' reduction orders) on the reference side's captured query/key/value.

A side names its replay (``SideSpec.replay``, default by engine: ``DEFAULT_REPLAYS``); the estimate
at a layer is the difference between the two replays' outputs, which is what ``drift`` would say
for these inputs. Where a replay is exact for its engine (``megatron-local`` on CPU) the estimate
equals the measured share; where the engine cannot run here (a GPU kernel) it is the only figure.
This module is the probe's one caller of ``reference/``.
"""

from __future__ import annotations

from typing import Any

from nemo_rl_attn_align.probe.capture import Capture
from nemo_rl_attn_align.vocab.errors import UsageError

#: The replay of each side engine's attention on this machine.
DEFAULT_REPLAYS = {"megatron": "megatron-local", "megatron-bridge": "megatron-local"}


def check_name(text: str, where: str) -> None:
    """A replay name ``reference``'s materializers take; a ``UsageError`` naming ``where`` otherwise."""
    from nemo_rl_attn_align.reference.materializers import parse_materializer

    try:
        parse_materializer(text)
    except ValueError as err:
        raise UsageError(f"{where}: replay={text!r}: {err}") from None


def attention(capture: Capture, layer: int, replay: str, scale: float | None) -> Any:
    """``replay`` run on ``capture``'s query/key/value at ``layer``, one sequence at a time: ``[tokens, H * D]``."""
    import torch

    from nemo_rl_attn_align.reference.materializers import parse_materializer

    materializer = parse_materializer(replay)
    tensors = capture.layers[layer]
    outputs, offset = [], 0
    for sequence in capture.sequences:
        q, k, v = (tensors[n][offset : offset + len(sequence)] for n in ("query", "key", "value"))
        out, _ = materializer(q, k, v, scale=scale)
        outputs.append(out.reshape(len(sequence), -1))
        offset += len(sequence)
    return torch.cat(outputs)


def estimate(reference: Capture, other: Capture, layer: int) -> tuple[Any, Any] | None:
    """The two sides' replays on the reference's inputs at ``layer`` (None: a side names no replay)."""
    names = [c.settings.get("replay") for c in (reference, other)]
    if None in names:
        return None
    scales = [c.settings.get("model", {}).get("softmax_scale") for c in (reference, other)]
    return attention(reference, layer, str(names[0]), scales[0]), attention(reference, layer, str(names[1]), scales[1])
