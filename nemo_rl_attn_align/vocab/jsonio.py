"""Strict JSON, the one way the plugin writes and reads it (stdlib only).

Written (``dumps``, ``iterencode``): what ``json.dumps`` writes, except that a non-finite float (NaN,
Infinity) is written as ``null``, so every file and ``--json`` output is JSON a strict parser takes.
With ``indent`` the text is ``json.dumps(value, indent=...)``'s byte for byte, made in chunks, and a
dict or list the value holds more than once (a report of many workers running one contract shares
their fields) is encoded once and reused.

Read (``loads``, ``read_json_file``): a duplicate key, ``NaN``, ``Infinity`` or a number too large
for a float, and nesting deeper than ``limits.MAX_NESTING`` are refused with one line naming where
the text came from (``InputRefused``); malformed text raises ``json.JSONDecodeError`` as usual.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii
from typing import Any

from nemo_rl_attn_align.vocab.limits import MAX_INT_DIGITS, MAX_NESTING, InputRefused, read_text, shown, shown_path


def _finite_copy(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_copy(item) for item in value]
    return value


def dumps(
    value: Any, *, indent: int | None = None, sort_keys: bool = False, separators: tuple[str, str] | None = None
) -> str:
    """``json.dumps(value, indent=..., sort_keys=..., separators=...)`` with non-finite floats as
    ``null`` (``separators`` only without ``indent``)."""
    if indent is not None:
        return "".join(iterencode(value, indent=indent, sort_keys=sort_keys))
    try:
        return json.dumps(value, allow_nan=False, sort_keys=sort_keys, separators=separators)
    except ValueError as err:
        if "Circular reference" in str(err):
            raise
        return json.dumps(_finite_copy(value), allow_nan=False, sort_keys=sort_keys, separators=separators)


def _shared_containers(value: Any) -> set[int]:
    """The ids of the dicts and lists ``value`` holds more than once (each is walked once)."""
    seen: set[int] = set()
    shared: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if id(node) in seen:
            shared.add(id(node))
            continue
        seen.add(id(node))
        stack.extend(child for child in children if isinstance(child, (dict, list, tuple)))
    return shared


def _scalar(value: Any) -> str:
    """One JSON scalar as ``json.dumps`` writes it (a non-finite float: ``null``)."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value) if math.isfinite(value) else "null"
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it (strings; numbers, booleans and None converted)."""
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if isinstance(key, (int, float)) or key is None:
        return encode_basestring_ascii(_scalar(key) if not isinstance(key, float) else float.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


class _IndentedEncoder:
    """``json.dumps(value, indent=indent)``'s text in chunks, shared containers encoded once."""

    def __init__(self, value: Any, indent: int, sort_keys: bool):
        self.unit = " " * indent
        self.sort_keys = sort_keys
        self.shared = _shared_containers(value)
        self.texts: dict[int, str] = {}  # id -> text at level 0 of a shared container
        self.active: set[int] = set()  # containers being encoded (a cycle is refused, as json does)

    def text(self, node: Any, level: int) -> str:
        """The whole text of ``node`` at ``level`` (a shared container's from its cached text)."""
        if id(node) in self.shared:
            cached = self.texts.get(id(node))
            if cached is None:
                cached = self.texts[id(node)] = "".join(self.chunks(node, 0, use_cache=False))
            return cached.replace("\n", "\n" + self.unit * level) if level else cached
        return "".join(self.chunks(node, level))

    def chunks(self, node: Any, level: int, use_cache: bool = True) -> Iterator[str]:
        """``node``'s text at ``level`` (nested ``level`` indents deep) in pieces."""
        if use_cache and id(node) in self.shared and isinstance(node, (dict, list, tuple)):
            yield self.text(node, level)
            return
        if isinstance(node, dict):
            items = sorted(node.items()) if self.sort_keys else node.items()
            pairs = ((_key(key) + ": ", item) for key, item in items)
            yield from self._container(node, "{", "}", pairs, level)
        elif isinstance(node, (list, tuple)):
            yield from self._container(node, "[", "]", (("", item) for item in node), level)
        else:
            yield _scalar(node)

    def _container(self, node: Any, opening: str, closing: str, entries, level: int) -> Iterator[str]:
        if not node:
            yield opening + closing
            return
        if id(node) in self.active:
            raise ValueError("Circular reference detected")
        self.active.add(id(node))
        inner = "\n" + self.unit * (level + 1)
        separator = opening
        for prefix, item in entries:
            if isinstance(item, (dict, list, tuple)):
                yield separator + inner + prefix
                yield from self.chunks(item, level + 1)
            else:
                yield separator + inner + prefix + _scalar(item)
            separator = ","
        yield "\n" + self.unit * level + closing
        self.active.discard(id(node))


def iterencode(value: Any, *, indent: int = 2, sort_keys: bool = False) -> Iterator[str]:
    """The text of ``dumps(value, indent=indent, sort_keys=sort_keys)`` in chunks, for a large
    document written without holding its whole text."""
    return _IndentedEncoder(value, indent, sort_keys).chunks(value, 0)


def write(stream: Any, value: Any, *, indent: int = 2, chunk_chars: int = 1 << 16) -> None:
    """Write ``dumps(value, indent=indent)`` to the text ``stream``, a chunk of about
    ``chunk_chars`` characters at a time."""
    buffered: list[str] = []
    size = 0
    for chunk in iterencode(value, indent=indent):
        buffered.append(chunk)
        size += len(chunk)
        if size >= chunk_chars:
            stream.write("".join(buffered))
            buffered, size = [], 0
    stream.write("".join(buffered))


def container_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """Depth of nested dicts and lists in a parsed JSON value (a scalar is 0); stops counting past
    ``limit`` + 1, iteratively, so no input can exhaust the stack."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest, stack = 1, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if depth > limit:
                return depth
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return deepest


def loads(text: str, where: str = "JSON text", *, strict: bool = True) -> Any:
    """The value of the JSON ``text``: ``InputRefused`` (one line naming ``where``) for nesting
    deeper than ``MAX_NESTING`` or an integer of more than ``MAX_INT_DIGITS`` digits, and, ``strict``
    (the plugin's own records and reports), for a duplicate key, ``NaN`` / ``Infinity`` or a number a
    float cannot hold; ``json.JSONDecodeError`` for text that is not JSON. Not ``strict`` (a model's
    ``config.json``, which the hosts read with Python's ``json``): those read as Python's ``json``
    reads them, for the caller to judge."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            keys = [key for key, _ in pairs]
            duplicate = next(key for index, key in enumerate(keys) if key in keys[:index])
            raise InputRefused(
                f"{where}: the key {shown(duplicate)} appears twice in one object; strict JSON has it once"
            )
        return obj

    def non_finite(name: str) -> Any:
        raise InputRefused(f"{where}: {name} is not a JSON number (strict JSON has no NaN or Infinity)")

    def finite_float(digits: str) -> float:
        number = float(digits)
        if not math.isfinite(number):
            raise InputRefused(f"{where}: the number {shown(digits)} is too large for a float")
        return number

    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise InputRefused(f"{where}: an integer of {len(digits)} digits, over the limit of {MAX_INT_DIGITS}")
        return int(digits)

    hooks: dict[str, Any] = {"parse_int": bounded_int}
    if strict:
        hooks.update(object_pairs_hook=unique, parse_constant=non_finite, parse_float=finite_float)
    try:
        data = json.loads(text, **hooks)
    except RecursionError:
        raise InputRefused(f"{where} nests deeper than {MAX_NESTING} levels") from None
    if container_depth(data) > MAX_NESTING:
        raise InputRefused(f"{where} nests deeper than {MAX_NESTING} levels")
    return data


def read_json_file(path: os.PathLike[str] | str, limit: int, what: str, *, strict: bool = True) -> Any:
    """The JSON value of the regular file ``path`` (at most ``limit`` bytes; ``strict`` as ``loads``).
    Raises ``ValueError`` with one line (``InputRefused``, bad UTF-8, bad JSON) or ``OSError``; a FIFO
    or device is refused without blocking."""
    return loads(read_text(path, limit, what), f"{what} {shown_path(path)}", strict=strict)
