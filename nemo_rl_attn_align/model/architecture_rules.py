"""The rules of the architecture table: how a host turns a ``config.json`` into one attention value.

A rule is JSON (a list whose first item names the operation), written by
``scripts/update_architecture_table.py`` from what the hosts answered over sampled configs, and read
here against a user's ``config.json`` (a dict). ``evaluate(rule, config)`` gives the value, or
``MISSING`` when a key the rule reads is absent (which the caller reports, never guesses):

* ``["const", v]``: always ``v``.
* ``["key", "a.b"]``: the config's value at dotted path ``a.b`` (``MISSING`` when absent).
* ``["add", r, n]``, ``["sum", r1, r2]``, ``["mul", r1, r2]``, ``["floordiv", r1, r2]``: integer
  arithmetic (None when an operand is None: a host given ``sliding_window: null`` computes nothing).
* ``["or", r1, r2]``: ``r1`` unless it is ``MISSING`` or None, then ``r2``.
* ``["default", r1, r2]``: ``r1`` unless it is ``MISSING`` (the config lacks the key), then ``r2``
  (what the host's config class fills in).
* ``["pair", r1, r2]``: ``[v1, v2]`` (None when ``v1`` is None).
* ``["map", r, {token: value}]``: each item of the list (or string) ``r`` looked up (``MISSING`` for
  a token the table does not know).
* ``["join", r]``: the list ``r`` joined into one string (a per-layer pattern such as ``"M*M-"``).
* ``["len", r]``: the length of the list (or string) ``r``.
* ``["present", r]``: whether ``r`` is not None (``MISSING`` when it is: a key the config lacks may
  still be filled in by the host's config class, which a ``default`` around it says).
* ``["rsqrt", r]``: ``1 / sqrt(r)`` (a softmax scale from the dimension it is taken from, Gemma's
  ``query_pre_attn_scalar``; None when ``r`` is not a positive number).

Per-layer facts are told apart by a *partition* (``{"by": "all"}``, ``{"by": "token", "key": path}``:
the layer's item of a per-layer list or string, with ``"else": path2`` the one to read where the
config has no ``path``; ``{"by": "period", "period": p}``: the layer index modulo ``p``);
``layer_kind`` gives a layer's kind under one. ``keys(rule)`` names the paths a rule
reads. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class _Missing:
    """A value the config does not give (a key it lacks, a token a table does not know)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()
#: What the table's rules give for a field one host's object does not have (a provider without MLA ranks).
ABSENT = "<absent>"


def lookup(config: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` of ``config`` (``MISSING`` where a part is absent or not a mapping)."""
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _arith(op: str, a: Any, b: Any) -> Any:
    if a is MISSING or b is MISSING:
        return MISSING
    if not (_int(a) and _int(b)):
        return None
    if op == "floordiv":
        return a // b if b else None
    return a + b if op == "sum" else a * b


def evaluate(rule: list, config: Mapping[str, Any]) -> Any:
    """The value ``rule`` gives for ``config`` (``MISSING`` when the config lacks what it reads)."""
    op = rule[0]
    if op == "const":
        return rule[1]
    if op == "key":
        return lookup(config, rule[1])
    if op == "add":
        value = evaluate(rule[1], config)
        return value if value is MISSING or not _int(value) else value + rule[2]
    if op in ("sum", "mul", "floordiv"):
        return _arith(op, evaluate(rule[1], config), evaluate(rule[2], config))
    if op in ("or", "default"):
        first = evaluate(rule[1], config)
        fall_back = first is MISSING or (op == "or" and first is None)
        return evaluate(rule[2], config) if fall_back else first
    if op == "pair":
        first, second = evaluate(rule[1], config), evaluate(rule[2], config)
        if first is MISSING or second is MISSING:
            return MISSING
        return None if first is None else [first, second]
    if op == "map":
        items, table = evaluate(rule[1], config), rule[2]
        if not isinstance(items, (list, str)):
            return MISSING if items is MISSING else None
        mapped = [table.get(str(item), MISSING) for item in items]
        return MISSING if any(m is MISSING for m in mapped) else mapped
    if op in ("join", "len"):
        items = evaluate(rule[1], config)
        if not isinstance(items, (list, str)):
            return MISSING if items is MISSING else None
        if op == "len":
            return len(items)
        return "".join(map(str, items)) if all(isinstance(i, str) for i in items) else None
    if op == "present":
        value = evaluate(rule[1], config)
        return MISSING if value is MISSING else value is not None
    if op == "rsqrt":
        value = evaluate(rule[1], config)
        if value is MISSING:
            return MISSING
        positive = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return 1.0 / math.sqrt(value) if positive else None
    raise ValueError(f"unknown rule operation {op!r} (the table was written by a newer generator)")


def keys(rule: list) -> list[str]:
    """The config paths ``rule`` reads, in order."""
    if rule[0] == "key":
        return [rule[1]]
    if rule[0] == "const":
        return []
    return [k for part in rule[1:] if isinstance(part, list) for k in keys(part)]


def layer_kind(partition: Mapping[str, Any], config: Mapping[str, Any], index: int) -> str | None:
    """The kind of layer ``index`` under ``partition`` (None when the config does not say)."""
    if partition["by"] == "all":
        return "all"
    if partition["by"] == "period":
        return str(index % partition["period"])
    items = lookup(config, partition["key"])
    if items is MISSING and "else" in partition:
        items = lookup(config, partition["else"])
    return str(items[index]) if isinstance(items, (list, str)) and index < len(items) else None
