"""Infer the architecture table's rules from what a host answered over sampled configs.

``synthesize(configs, values)`` finds the simplest rule (``nemo_rl_attn_align.preflight.
architecture_rules``) that gives ``values[i]`` for ``configs[i]`` for every sampled config, trying in
order: a constant, one key, one key plus or minus one, two keys combined (``//``, ``+``, ``*``), a
softmax scale ``1 / sqrt(d)`` of a dimension ``d`` one of those gives, a
pair, a per-layer token map, then one key where the config gives it, with a rule for the configs
that lack it and one for those that set it to null. ``synthesize_layers`` does the same for a
host's per-layer answers: it
finds what tells the layer kinds apart (nothing, a per-layer list or string of the config, or the
layer index modulo a period) and a rule for each field of each kind. Nothing here knows an
architecture: whatever the rules say came from the host. Used by ``update_architecture_table.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from nemo_rl_attn_align.model.architecture_rules import ABSENT, MISSING, evaluate, keys, layer_kind, lookup

#: Layer-index periods tried for per-layer kinds (``i % p``).
PERIODS = (2, 3, 4, 5, 6)
#: Floats a host computes another way than a rule (``d ** -0.5`` against ``1 / sqrt(d)``) are equal within this.
FLOAT_TOLERANCE = 1e-12


class NoRule(Exception):
    """No rule of the grammar reproduces the host on every sampled config; the message says what failed."""


def same(a: Any, b: Any) -> bool:
    """Equal values of the same JSON type (``1`` is not ``True``; lists item by item)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=FLOAT_TOLERANCE)
    return type(a) is type(b) and a == b


def _leaves(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key in sorted(config):
        value = config[key]
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def paths_of(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every leaf path of the configs, shallow ones first, then by name."""
    found = {path for config in configs for path, _ in _leaves(config)}
    return sorted(found, key=lambda p: (p.count("."), p))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(rule: list, configs: Sequence[Mapping[str, Any]], values: Sequence[Any]) -> bool:
    return all(same(evaluate(rule, c), v) for c, v in zip(configs, values, strict=True))


def _unary(paths: list[str], configs: Sequence[Mapping[str, Any]]) -> Iterator[list]:
    ints = [p for p in paths if any(_is_int(lookup(c, p)) for c in configs)]
    for path in paths:
        yield ["key", path]
    for path in paths:
        yield ["present", ["key", path]]
    for path in paths:
        if any(isinstance(lookup(c, path), (list, str)) for c in configs):
            yield ["len", ["key", path]]
    for path in ints:
        yield ["add", ["key", path], -1]
        yield ["add", ["key", path], 1]
    for a, b in itertools.permutations(ints, 2):
        yield ["floordiv", ["key", a], ["key", b]]
    for a, b in itertools.combinations(ints, 2):
        yield ["sum", ["key", a], ["key", b]]
        yield ["mul", ["key", a], ["key", b]]


def _token_map(path: str, configs: Sequence[Mapping[str, Any]], values: Sequence[Any]) -> list | None:
    """``["map", ["key", path], table]`` when every value is the per-item image of the list/string at ``path``."""
    table: dict[str, Any] = {}
    for config, value in zip(configs, values, strict=True):
        items = lookup(config, path)
        if not isinstance(items, (list, str)) or not isinstance(value, list) or len(items) != len(value):
            return None
        for item, mapped in zip(items, value, strict=True):
            if str(item) in table and not same(table[str(item)], mapped):
                return None
            table.setdefault(str(item), mapped)
    return ["map", ["key", path], dict(sorted(table.items()))] if table else None


def _direct(configs: Sequence[Mapping[str, Any]], values: Sequence[Any], paths: list[str], depth: int) -> list | None:
    """The first rule that fits without a fallback for configs lacking a key (pairs: each part with one)."""
    if all(same(v, values[0]) for v in values):
        return ["const", values[0]]
    for rule in _unary(paths, configs):
        if _fits(rule, configs, values):
            return rule
    scale = _scale(configs, values, paths, depth)
    if scale is not None:
        return scale
    if all(v is None or (isinstance(v, list) and len(v) == 2) for v in values) and any(values):
        lists = [(c, v) for c, v in zip(configs, values, strict=True) if v is not None]
        try:
            first = synthesize(configs, [v[0] if v else None for v in values], paths, depth)
            second = synthesize([c for c, _ in lists], [v[1] for _, v in lists], paths, depth)
        except NoRule:
            return None
        rule = ["pair", first, second]
        return rule if _fits(rule, configs, values) else None
    if all(isinstance(v, (list, str)) for v in values):
        strings = all(isinstance(v, str) for v in values)
        for path in paths:
            rule = _token_map(path, configs, [list(v) if strings else v for v in values])
            if rule is not None:
                return ["join", rule] if strings else rule
    return None


def _dimension(scale: Any) -> int | None:
    """The integer ``d`` of a softmax scale ``d ** -0.5`` (within rounding); None for anything else."""
    if not isinstance(scale, float) or scale <= 0:
        return None
    d = 1.0 / (scale * scale)
    return round(d) if math.isclose(d, round(d), rel_tol=1e-9) else None


def _scale(configs: Sequence[Mapping[str, Any]], values: Sequence[Any], paths: list[str], depth: int) -> list | None:
    """``["rsqrt", r]`` when every value is a softmax scale (or None) of an integer dimension ``r`` gives."""
    dims = [None if v is None else _dimension(v) for v in values]
    if not any(values) or any(d is None and v is not None for d, v in zip(dims, values, strict=True)):
        return None
    try:
        rule = ["rsqrt", synthesize(configs, dims, paths, depth)]
    except NoRule:
        return None
    return rule if _fits(rule, configs, values) else None


def _split(configs: Sequence[Mapping[str, Any]], path: str) -> tuple[list[int], list[int], list[int]]:
    """The configs that give ``path``, those that lack it and those that set it to null (indices)."""
    given, absent, null = [], [], []
    for i, config in enumerate(configs):
        value = lookup(config, path)
        (absent if value is MISSING else null if value is None else given).append(i)
    return given, absent, null


def _fallbacks(
    configs: Sequence[Mapping[str, Any]], values: Sequence[Any], paths: list[str], depth: int
) -> list | None:
    """A rule for the configs that give one key, with one rule for those that lack it (``default``)
    and one for those that set it to null (``or``; both as one ``or`` when they are equal); or a
    rule for the configs that have the key (null or not) with a ``default`` for those that lack it."""
    for path in paths:
        given, absent, null = _split(configs, path)
        if not given or len(given) == len(configs):
            continue
        for first_group, fills in (
            (given, ((absent, "default"), (null, "or"))),
            (given + null, ((absent, "default"),)),
        ):
            rule = _with_fills(configs, values, paths, depth, path, first_group, fills)
            if rule is not None:
                return rule
    return None


def _with_fills(configs, values, paths, depth, path, first_group, fills) -> list | None:
    """``_fallbacks``' rule for one way of grouping the configs, or None."""
    if not first_group or (fills[-1][1] == "default" and not fills[-1][0]):
        return None
    try:
        first = synthesize([configs[i] for i in first_group], [values[i] for i in first_group], paths, depth - 1)
        if path not in keys(first):
            return None
        fill = {
            op: synthesize([configs[i] for i in group], [values[i] for i in group], paths, depth - 1)
            for group, op in fills
            if group
        }
    except NoRule:
        return None
    if len(fill) == 2 and same(fill["default"], fill["or"]):
        rule = ["or", first, fill["or"]]
    else:
        rule = first
        for op in ("default", "or"):
            if op in fill:
                rule = [op, rule, fill[op]]
    return rule if _fits(rule, configs, values) else None


def synthesize(
    configs: Sequence[Mapping[str, Any]], values: Sequence[Any], paths: list[str] | None = None, depth: int = 2
) -> list:
    """The simplest rule giving ``values[i]`` for ``configs[i]``; ``NoRule`` when the grammar has none."""
    if not configs:
        raise NoRule("no sampled config to learn from")
    paths = paths_of(configs) if paths is None else paths
    rule = _direct(configs, values, paths, depth)
    if rule is None and depth > 1:
        rule = _fallbacks(configs, values, paths, depth)
    if rule is not None:
        return rule
    shown = ", ".join(repr(v) for v in values[:6])
    raise NoRule(f"no rule of the grammar gives the host's values ({shown}{', ...' if len(values) > 6 else ''})")


def _partitions(configs: Sequence[Mapping[str, Any]], counts: Sequence[int], paths: list[str]) -> Iterator[dict]:
    """Ways to tell layer kinds apart, simplest first: none, a per-layer list/string, a period."""
    yield {"by": "all"}

    def per_layer(config: Mapping[str, Any], path: str, count: int) -> bool:
        items = lookup(config, path)
        return isinstance(items, (list, str)) and len(items) == count

    per_config = [[p for p in paths if per_layer(c, p, n)] for c, n in zip(configs, counts, strict=True)]
    for path in paths:
        if all(path in found for found in per_config):
            yield {"by": "token", "key": path}
    for path, other in itertools.permutations(paths, 2):  # one spelling, else another (a legacy key)
        if all((path in found) != (other in found) for found in per_config) and any(path in f for f in per_config):
            yield {"by": "token", "key": path, "else": other}
    for period in PERIODS:
        yield {"by": "period", "period": period}


def _classes(partition: dict, configs: Sequence[Mapping[str, Any]], layers: Sequence[Sequence[Any]]):
    """``{kind: [(config index, layer facts or None), ...]}`` when every kind's layers agree within
    each config (all absent, or the same facts); else None."""
    grouped: dict[str, dict[int, Any]] = {}
    for ci, (config, per_layer) in enumerate(zip(configs, layers, strict=True)):
        for index, facts in enumerate(per_layer):
            kind = layer_kind(partition, config, index)
            if kind is None:
                return None
            seen = grouped.setdefault(kind, {})
            if ci in seen and not same(seen[ci], facts):
                return None
            seen.setdefault(ci, facts)
    return {kind: sorted(by_config.items()) for kind, by_config in grouped.items()}


def _kind_rules(entries: list[tuple[int, Any]], configs: Sequence[Mapping[str, Any]], paths: list[str]) -> Any:
    """None for a kind that is never an attention layer; else a rule per field of its facts."""
    present = [facts is not None for _, facts in entries]
    if not any(present):
        return None
    if not all(present):
        raise NoRule("a layer kind is an attention layer in some sampled configs and not in others")
    fields = sorted({name for _, facts in entries for name in facts})
    kind_configs = [configs[ci] for ci, _ in entries]
    return {name: synthesize(kind_configs, [facts.get(name, ABSENT) for _, facts in entries], paths) for name in fields}


def synthesize_layers(configs: Sequence[Mapping[str, Any]], layers: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """``{"partition": ..., "kinds": {kind: None | {field: rule}}}`` reproducing every config's layers."""
    paths = paths_of(configs)
    counts = [len(per_layer) for per_layer in layers]
    failures = []
    for partition in _partitions(configs, counts, paths):
        classes = _classes(partition, configs, layers)
        if classes is None:
            continue
        try:
            kinds = {kind: _kind_rules(entries, configs, paths) for kind, entries in sorted(classes.items())}
        except NoRule as err:
            failures.append(f"{partition}: {err}")
            continue
        return {"partition": partition, "kinds": kinds}
    raise NoRule("no partition of the layers fits: " + ("; ".join(failures[:3]) or "kinds differ within a config"))
