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
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
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
            ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
        except Exception as err:  # HydraException, OmegaConfBaseException, RecursionError, ...
            first = first_line(err) or type(err).__name__
            raise UsageError(f"override {shown(text)} cannot be applied ({first}). Fix: {hint}.") from None


def _deepest_existing(cfg, key: str) -> tuple[int, Any]:
    """How many leading parts of the dotted ``key`` exist in ``cfg``, and the node the last one
    names (without resolving or tripping struct mode)."""
    from omegaconf import DictConfig, ListConfig

    node, parts = cfg, key.split(".")
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig) and part in node:
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return depth, node
    return len(parts), node


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
