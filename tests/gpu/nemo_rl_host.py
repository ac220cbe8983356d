"""Which NeMo-RL the GPU suite drives: the real one wherever ``nemo_rl`` is importable (a NeMo-RL
container or checkout), the stand-in layout (``tests/fake_nemo_rl/v0_6``) only where it is absent.

``locate`` finds ``nemo_rl`` on ``sys.path`` without importing it and without counting the stand-in
(which other tests may have put on ``sys.path``). A NeMo-RL that is present but broken is not
replaced by the stand-in: the cases then fail with its import error. Stdlib only.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN_ROOT = REPO / "tests" / "fake_nemo_rl"
STANDIN = STANDIN_ROOT / "v0_6"


@dataclass(frozen=True)
class NemoRLHost:
    """The NeMo-RL the suite drives: ``kind`` ``real`` or ``stand-in``, where it is, its version."""

    kind: str
    location: str
    version: str | None = None

    def line(self) -> str:
        """One line for the suite's summary."""
        if self.kind == "real":
            return (
                f"mcore suite: real NeMo-RL worker path (nemo_rl {self.version or 'version unknown'} "
                f"at {self.location})"
            )
        return f"mcore suite: stand-in NeMo-RL layout {self.location} (NeMo-RL is not importable here)"

    def to_dict(self) -> dict:
        return asdict(self)


def _outside_standin(entry: str) -> bool:
    try:
        return not Path(entry or ".").resolve().is_relative_to(STANDIN_ROOT)
    except OSError:
        return True


def locate(path: Sequence[str] | None = None) -> NemoRLHost:
    """The real ``nemo_rl`` found on ``path`` (default ``sys.path``), else the stand-in."""
    search = [entry for entry in (sys.path if path is None else path) if _outside_standin(entry)]
    spec = importlib.machinery.PathFinder.find_spec("nemo_rl", search)
    if spec is None or spec.origin is None or not spec.submodule_search_locations:  # absent, or a bare folder
        return NemoRLHost("stand-in", str(STANDIN.relative_to(REPO)))
    package = Path(next(iter(spec.submodule_search_locations)))
    version = None
    for distribution in ("nemo-rl", "nemo_rl"):
        try:
            version = metadata.version(distribution)
            break
        except metadata.PackageNotFoundError:
            continue
    return NemoRLHost("real", str(package), version)
