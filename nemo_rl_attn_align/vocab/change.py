"""One config setting the preset, its kernel step or ``check --fix`` makes, as a Hydra override. Stdlib only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    """One config setting the preset or ``--fix`` makes: the dotted key, the value, why, and whether
    it ``alters_run`` (changes the parallel layout or the rollout precision, which the preset never
    does; ``check --fix`` lists such changes with their cost)."""

    key: str
    value: Any
    reason: str
    alters_run: bool = False

    def override(self) -> str:
        """The Hydra override that makes this change (``++`` adds or sets), quoted for a POSIX shell."""
        value = json.dumps(self.value) if isinstance(self.value, str) else _hydra_scalar(self.value)
        text = f"++{self.key}={value}"
        return "'" + text.replace("'", "'\\''") + "'"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "reason": self.reason,
            "alters_run": self.alters_run,
            "override": self.override(),
        }


def _hydra_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
