"""Looking values up in a resolved NeMo-RL config (a plain dict), as NeMo-RL's own ``.get`` chains do.

``Fact`` is a value with the dotted key it was read from; ``UNSET`` marks a key that is absent.
The recipe's readers (``preflight``'s facts, ``model.model_facts``) share these lookups. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Marks a key that is absent from the config (as opposed to present with value null).
UNSET = type("Unset", (), {"__repr__": lambda self: "<unset>"})()


@dataclass(frozen=True)
class Fact:
    """One config value and the dotted key it was read from."""

    value: Any
    key: str


def is_count(value: Any) -> bool:
    """An integer >= 1 as NeMo-RL and Megatron use it (not a bool: YAML's ``true``, ``yes`` and ``on``
    are booleans, and NeMo-RL's ``np.arange(...).reshape`` of the layout raises on one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(value: Any) -> int | None:
    """``value`` when it is a positive int (a batch or step count; not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def get_or_unset(node: Any, key: str) -> Any:
    """``node[key]`` when ``node`` is a dict holding it, else ``UNSET``."""
    return node.get(key, UNSET) if isinstance(node, dict) else UNSET


def section(node: Any, key: str) -> Mapping[str, Any]:
    """``node[key]`` (``key`` may be dotted: ``"policy.generation"``) when every level is a mapping,
    else an empty one (NeMo-RL's ``.get(key, {})``)."""
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def value_at(cfg: Any, dotted: str) -> Any:
    """The value at a dotted key of nested dicts, None where a level is missing or not a dict."""
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


def as_env_vars(value: Any) -> dict[str, str]:
    """``env_vars`` as the worker gets them (``str`` of each name and value); {} when not a mapping
    (a non-mapping env_vars is NeMo-RL's error to report)."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}
