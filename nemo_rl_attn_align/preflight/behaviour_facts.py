"""The behaviour fields (``rope``, ``mask``, ``softmax``) a host computed before launch, as facts the
preview reads (``RecipeFacts.behaviour``). Stdlib only.

``check --training-python PY`` / ``--rollout-python PY`` / ``--behaviour`` run each side's host in
its own process (``cli/check_behaviour.py`` -> ``hosts/behaviour_preview.py``): the model NeMo-RL's
worker would build, on the meta device, read by the worker's own reader. ``ComputedBehaviour`` holds
what came back for one contract side (``training`` or ``rollout``): each field as the reader gave it
(a ``FieldValue`` dict: observed, or unobservable with the reason), or why the side was not computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The flag that computes each side, as the notes and sources name it.
FLAGS = {"training": "--training-python", "rollout": "--rollout-python"}


@dataclass(frozen=True)
class ComputedBehaviour:
    """One contract side's behaviour fields as its host computed them here, or why they were not."""

    side: str
    #: the interpreter that ran the host
    python: str
    #: the host and its versions (``"Megatron-Bridge (megatron-bridge 0.6.2, megatron-core 0.19.2)"``);
    #: None where nothing was computed
    host: str | None = None
    #: field -> ``{"value", "provenance", "source"}`` as the host's reader made it
    fields: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: why the side was not computed (None where it was)
    why_not: str | None = None
    #: what was replaced to build the model here (no Transformer Engine, no GPU)
    substitutions: tuple[str, ...] = ()
    #: the reader's failures (each also leaves its field not computed)
    problems: tuple[str, ...] = ()
    seconds: float | None = None

    def computed(self, name: str) -> tuple[Any, str] | str:
        """Field ``name``'s value and the reader's source, or why it was not computed."""
        if self.why_not is not None:
            return self.why_not
        found = self.fields.get(name)
        if not isinstance(found, Mapping) or found.get("provenance") != "observed":
            return str(found.get("source") or "not read") if isinstance(found, Mapping) else "not read"
        return found.get("value"), str(found.get("source", ""))

    def to_dict(self) -> dict[str, Any]:
        """What ``check --json`` shows under ``behaviour.<side>`` (the values are in the preview's contracts)."""
        names = sorted(self.fields)
        return {
            "python": self.python,
            "host": self.host,
            "computed": [n for n in names if not isinstance(self.computed(n), str)],
            "not_computed": {n: why for n in names if isinstance(why := self.computed(n), str)}
            if self.why_not is None
            else None,
            "why_not": self.why_not,
            "substitutions": list(self.substitutions),
            "problems": list(self.problems),
            "seconds": self.seconds,
        }
