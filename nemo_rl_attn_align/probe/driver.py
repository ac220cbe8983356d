"""The probe's driver: each side in its own process, the second replaying the first's attention inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from nemo_rl_attn_align.probe import capture, divergence, sides


@dataclass(frozen=True)
class ProbeRequest:
    """Two sides (``reference``: the training side), the batch, and what to compare."""

    reference: sides.SideSpec
    other: sides.SideSpec
    sequences: list[list[int]]
    workdir: Path
    layers: list[int] | None = None
    atol: float = 0.0


def run(request: ProbeRequest) -> divergence.ProbeResult:
    """Capture the reference, then the other side with the reference's query/key/value; compare them."""
    reference = replace(request.reference, sequences=request.sequences)
    other = replace(request.other, sequences=request.sequences)
    if reference.name == other.name:
        other = replace(other, name=f"{other.name}-2")
    sides.preflight([reference, other], request.workdir)
    reference_file = sides.run(reference, request.workdir)
    other_file = sides.run(other, request.workdir, reference=reference_file)
    return divergence.compare(capture.load(reference_file), capture.load(other_file), request.layers, request.atol)
