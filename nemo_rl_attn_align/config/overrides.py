"""Hydra-style command-line overrides, applied as NeMo-RL's ``parse_hydra_overrides`` applies them
(``OmegaConf.set_struct(cfg, True)``: a key not in the file needs ``++key=value``), with every way one
can fail turned into a one-line ``UsageError`` whose fix says what to write instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.limits import (
    MAX_NESTING,
    MAX_OVERRIDE_CHARS,
    MAX_OVERRIDE_ELEMENTS,
    MAX_OVERRIDE_KEY_DEPTH,
    MAX_OVERRIDES,
    MAX_OVERRIDES_TOTAL_CHARS,
    first_line,
    shown,
)

_USAGE = "Fix: write key=value, ++key=value to add a key, ~key to delete one"
#: A quoted string of Hydra's grammar ('...' or "...", backslash escapes): its commas are text.
_QUOTED = re.compile(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"")


def check_override_limits(overrides: Sequence[str]) -> None:
    """Refuse the overrides, before any is parsed, when they are more than ``MAX_OVERRIDES``, one is
    longer than ``MAX_OVERRIDE_CHARS``, all together are longer than ``MAX_OVERRIDES_TOTAL_CHARS`` or
    hold more than ``MAX_OVERRIDE_ELEMENTS`` elements, or one nests too deep (each one line)."""
    if len(overrides) > MAX_OVERRIDES:
        raise UsageError(
            f"{len(overrides)} overrides, over the limit of {MAX_OVERRIDES}. "
            "Fix: put the settings in a YAML file (a recipe whose defaults: names this one)."
        )
    for text in overrides:
        if len(text) > MAX_OVERRIDE_CHARS:
            raise UsageError(
                f"override {shown(text)} is {len(text)} characters, over the limit of {MAX_OVERRIDE_CHARS}. "
                "Fix: put large values in the YAML file."
            )
    total = sum(len(text) for text in overrides)
    if total > MAX_OVERRIDES_TOTAL_CHARS:
        raise UsageError(
            f"the {len(overrides)} overrides are {total} characters in all, over the limit of "
            f"{MAX_OVERRIDES_TOTAL_CHARS}. Fix: put large values in the YAML file."
        )
    elements = sum(_QUOTED.sub("", text).count(",") for text in overrides)
    if elements > MAX_OVERRIDE_ELEMENTS:
        raise UsageError(
            f"the overrides hold {elements} list, mapping or sweep elements in all (commas outside quotes), over "
            f"the limit of {MAX_OVERRIDE_ELEMENTS}. Fix: put long lists in the YAML file."
        )
    for text in overrides:
        _check_override_shape(text)


def _check_override_shape(text: str) -> None:
    """Refuse an override whose key or value nests deeper than ``MAX_NESTING``, before Hydra's
    recursive parser sees it."""
    key = text.lstrip("+~").split("=", 1)[0]
    if key.count(".") + 1 > MAX_OVERRIDE_KEY_DEPTH:
        raise UsageError(
            f"override {shown(text)}: its key has {key.count('.') + 1} levels, over the limit of "
            f"{MAX_OVERRIDE_KEY_DEPTH}. Fix: NeMo-RL configs nest a few levels; check the key."
        )
    depth = deepest = 0
    for ch in text:
        depth += (ch in "[{(") - (ch in "]})")
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        raise UsageError(
            f"override {shown(text)}: its value nests deeper than {MAX_NESTING} levels. Fix: flatten the value."
        )


def apply_overrides(cfg, overrides: Sequence[str]) -> None:
    """Apply Hydra-style overrides in place, exactly as NeMo-RL's ``parse_hydra_overrides``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    check_override_limits(overrides)
    OmegaConf.set_struct(cfg, True)
    parser = OverridesParser.create()
    for text in overrides:
        try:
            parsed = parser.parse_overrides(overrides=[text])
        except Exception as err:  # HydraException; RecursionError and others from the grammar
            raise UsageError(
                f"override {shown(text)} is malformed ({first_line(err) or type(err).__name__}). {_USAGE}."
            ) from None
        override = parsed[0]
        if not override.key_or_group:
            raise UsageError(f"override {shown(text)} has no key. {_USAGE}.")
        hint = _override_hint(cfg, override)  # before applying: a failed override can leave the config changed
        try:
            apply_override(cfg, override)
        except Exception as err:  # HydraException, OmegaConfBaseException, RecursionError, ...
            first = first_line(err) or type(err).__name__
            raise UsageError(f"override {shown(text)} cannot be applied ({first}). Fix: {hint}.") from None


def apply_override(cfg, override) -> None:
    """Apply one parsed override to ``cfg`` as Hydra's config loader does (``ConfigLoaderImpl.
    _apply_overrides_to_config``, which NeMo-RL's ``parse_hydra_overrides`` calls), with OmegaConf's
    public API only: ``~key[=value]`` deletes, ``+key=value`` adds a key that is not there (or merges
    a mapping or list), ``++key=value`` adds or sets, ``key=value`` sets a key that is there. A
    refusal raises ``ValueError`` with Hydra's words (``tests/config/test_overrides.py`` compares)."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    key, line = override.key_or_group, override.input_line
    if override.package is not None:
        raise ValueError(
            f"Override {line} looks like a config group override, but config group '{key}' does not exist."
        )
    value = override.value()
    try:
        if override.is_delete():
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if current is None:
                raise ValueError(f"Could not delete from config. '{key}' does not exist.")
            if value is not None and value != current:
                raise ValueError(f"Could not delete from config. The value of '{key}' is {current} and not {value}.")
            parent, _, leaf = key.rpartition(".")
            with open_dict(cfg):
                del (OmegaConf.select(cfg, parent) if parent else cfg)[leaf]
        elif override.is_add() and OmegaConf.select(cfg, key, throw_on_missing=False) is not None:
            if not isinstance(value, (dict, list)):
                raise ValueError(f"Could not append to config. An item is already at '{key}'.")
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        elif override.is_add() or override.is_force_add():
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            try:
                OmegaConf.update(cfg, key, value, merge=True)
            except (ConfigAttributeError, ConfigKeyError) as err:
                raise ValueError(f"Could not override '{key}'.") from err
    except OmegaConfBaseException as err:
        raise ValueError(f"Error merging override {line}") from err


def _deepest_existing(cfg, key: str) -> tuple[int, Any]:
    """How many leading parts of the dotted ``key`` exist in ``cfg``, and the node the last one
    names (struct mode is never tripped: only keys that exist are read)."""
    from omegaconf import DictConfig, ListConfig

    node, parts = cfg, key.split(".")
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig) and part in node:
            node = _child(node, part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = _child(node, int(part))
        else:
            return depth, node
    return len(parts), node


def _child(node, part: str | int) -> Any:
    """``node[part]``; None where reading it fails (an interpolation that does not resolve, a
    missing ``???``): a value, not a mapping, for the hint."""
    try:
        return node[part]
    except Exception:  # OmegaConf's errors for a value it cannot give
        return None


def _override_hint(cfg, override) -> str:
    from omegaconf import DictConfig, ListConfig

    key = override.key_or_group
    depth, node = _deepest_existing(cfg, key)
    parts = key.split(".")
    exists = depth == len(parts)
    if not exists and depth and not isinstance(node, (DictConfig, ListConfig)):
        parent = ".".join(parts[:depth])
        return f"{parent} holds a value, not a mapping, so it has no key {parts[depth]}; set {parent}=VALUE instead"
    if override.is_delete():
        if exists:
            return f"write ~{key} (a value after ~{key}= must equal the current one)"
        return f"{key} is not in the config, so there is nothing to delete; drop ~{key}"
    if override.is_add():
        return (
            f"{key} is already in the config; write {key}=VALUE"
            if exists
            else f"check that the parent of {key} is a mapping"
        )
    if exists:
        return (
            f"{key} is in the config but this value cannot replace it; to add keys inside it, write ++{key}.NAME=VALUE"
        )
    if override.is_force_add():
        return f"check that the parent of {key} is a mapping and the value is valid"
    return f"{key} is not in the config; write ++{key}=VALUE to add it"
