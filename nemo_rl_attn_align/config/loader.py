"""Read a NeMo-RL YAML config exactly as NeMo-RL's recipes do.

NeMo-RL (``nemo_rl/utils/config.py`` at 7ea279a) loads a file with ``defaults:`` inheritance
(a string or a list, each path relative to the file naming it, chained depth-first, later parents
and finally the child winning, ``_override_: true`` replacing a section instead of merging it),
applies Hydra-style command-line overrides with ``OmegaConf.set_struct(cfg, True)`` (so a key that
is not in the file needs ``++key=value``), then resolves every ``${...}`` interpolation with its
``add``/``mul``/``div``/``max`` resolvers. This module does the same with the same libraries
(OmegaConf, hydra-core) and turns every way that can fail into a one-line ``UsageError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from nemo_rl_attn_align.config.yaml_compose import OverLimit, compose_yaml
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.limits import (
    MAX_CONFIG_BYTES,
    MAX_DEFAULTS_FILES,
    MAX_NESTING,
    MAX_SHOWN_CHARS,
    InputRefused,
    first_line,
    read_text,
    shown,
    shown_path,
    shown_text,
)

#: Sentinel for ``get_path`` when no default is given.
MISSING = object()


def register_nemo_rl_resolvers() -> None:
    """Register NeMo-RL's OmegaConf resolvers (``add``, ``mul``, ``div``, ``max``) if absent."""
    from omegaconf import OmegaConf

    resolvers = {
        "add": lambda a, b: a + b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "max": lambda a, b: max(a, b),
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _yaml_error(path: Path, err: Exception) -> UsageError:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or ["?"])[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
    return UsageError(
        f"{shown_path(path)}: YAML syntax error at {where}: {first_line(problem)}. Fix the YAML at that position."
    )


def _read_config_text(path: Path) -> str:
    """The file's text within ``MAX_CONFIG_BYTES``; every way a path can be unusable is one UsageError."""
    where = shown_path(path)
    try:
        return read_text(path, MAX_CONFIG_BYTES, "config file")
    except InputRefused as err:
        raise UsageError(f"{err}. Fix: pass a NeMo-RL YAML file (at most {MAX_CONFIG_BYTES} bytes).") from None
    except FileNotFoundError:
        raise UsageError(f"config file {where} does not exist. Fix: pass the path of a NeMo-RL YAML file.") from None
    except UnicodeDecodeError as err:
        raise UsageError(
            f"config file {where} is not UTF-8 text ({err.reason} at byte {err.start}). Fix: save it as UTF-8."
        ) from None
    except (OSError, ValueError) as err:  # permission, symlink loop, name too long, NUL in the path
        why = getattr(err, "strerror", None) or str(err)
        raise UsageError(
            f"config file {where} cannot be opened: {first_line(why)}. Fix: pass the path of a readable NeMo-RL YAML "
            f"file."
        ) from None


class _LoadState:
    """What one ``load_config`` has read so far: the files of the ``defaults:`` chain and the YAML
    nodes composed in all of them (both bounded)."""

    def __init__(self):
        self.files: list[Path] = []
        self.nodes = 0


def _load_one(path: Path, state: _LoadState):
    """One YAML file as a DictConfig, with OmegaConf's own loader, within the limits of ``limits``;
    its errors turned into UsageError."""
    import yaml
    from omegaconf import DictConfig, OmegaConf

    text = _read_config_text(path)
    try:
        obj, state.nodes = compose_yaml(text, state.nodes)
        if obj is not None and not isinstance(obj, dict):
            raise UsageError(
                f"{shown_path(path)}: the top level is a {type(obj).__name__}, not a mapping. "
                "Fix: a NeMo-RL config is a YAML mapping."
            )
        cfg = OmegaConf.create(obj if obj is not None else {})
    except UsageError:
        raise
    except OverLimit as err:
        raise UsageError(
            f"{shown_path(path)}: {err}. Fix: write fewer, flatter values (NeMo-RL's recipes have about 600)."
        ) from None
    except yaml.YAMLError as err:
        raise _yaml_error(path, err) from None
    except RecursionError:
        raise UsageError(
            f"{shown_path(path)}: the YAML nests deeper than {MAX_NESTING} levels. Fix: flatten the structure."
        ) from None
    except Exception as err:  # OmegaConf's own grammar errors (e.g. a bad key), int too long, ...
        raise UsageError(f"{shown_path(path)}: {type(err).__name__}: {first_line(err)}. Fix the YAML.") from None
    if not isinstance(cfg, DictConfig):
        raise UsageError(
            f"{shown_path(path)}: the top level is a {type(cfg).__name__}, not a mapping. Fix: a NeMo-RL config is a "
            f"YAML mapping."
        )
    return cfg


def _merge_with_override(base, child, path: Path):
    """OmegaConf.merge, honouring NeMo-RL's ``_override_: true`` section marker, step for step as
    NeMo-RL's ``merge_with_override`` (7ea279a): every top-level value of ``child`` but a mandatory
    ``???`` is read *before* the merge, so an interpolation there resolves against ``child`` alone
    (``${a}`` naming a key only a parent defines fails, as in NeMo-RL), and a value that
    interpolates a section carrying ``_override_`` consumes that marker, as it does in NeMo-RL."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        try:
            node = child[key]
        except OmegaConfBaseException as err:
            first = str(err).splitlines()[0]
            raise UsageError(
                f"{path}: {key} cannot be resolved while merging the file with its defaults ({type(err).__name__}: "
                f"{first}); NeMo-RL's loader fails on it too, because it reads each top-level value of a file before "
                "the merge. Fix: move the ${...} into a section (e.g. under policy:) or name a key of the same file."
            ) from None
        if isinstance(node, DictConfig) and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, child)


def _defaults_list(path: Path, raw: Any) -> list[str]:
    from omegaconf import ListConfig

    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, ListConfig) and all(isinstance(item, str) for item in raw):
        return [str(item) for item in raw]
    raise UsageError(
        f"{shown_path(path)}: defaults={shown(raw)} is not a file name or a list of file names. "
        "Fix: write `defaults: parent.yaml` or a YAML list of paths."
    )


def _real_path(path: Path) -> Path:
    """``path`` with symlinks resolved where that is possible (a symlink loop is left to the read to report)."""
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError, RuntimeError):
        return Path(os.path.abspath(path))


def _load_with_inheritance(path: Path, chain: tuple[Path, ...], state: _LoadState):
    resolved = _real_path(path)
    if resolved in chain:
        cycle = " -> ".join(shown_path(p) for p in (*chain, resolved))
        raise UsageError(
            f"defaults cycle: {shown_text(cycle, 4 * MAX_SHOWN_CHARS)}. Fix: remove one of these `defaults:` entries."
        )
    state.files.append(resolved)
    if len(state.files) > MAX_DEFAULTS_FILES:
        raise UsageError(
            f"{shown_path(path)}: the defaults chain reads more than {MAX_DEFAULTS_FILES} files. "
            "Fix: fold some parents together."
        )
    cfg = _load_one(path, state)
    if "defaults" not in cfg:
        return cfg
    from omegaconf import OmegaConf

    register_nemo_rl_resolvers()  # the recipes register them before loading; the merge reads values
    parents = _defaults_list(path, cfg.pop("defaults"))
    base = OmegaConf.create({})
    for parent in parents:
        parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
        base = _merge_with_override(base, _load_with_inheritance(parent_path, (*chain, resolved), state), parent_path)
    return _merge_with_override(base, cfg, path)


def _resolve(cfg) -> dict:
    """Resolve every interpolation; an unresolvable one becomes a UsageError naming its key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_nemo_rl_resolvers()
    try:
        return cast(dict, OmegaConf.to_container(cfg, resolve=True))  # a DictConfig resolves to a dict
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise UsageError(
            f"interpolation at {shown_text(str(key))} cannot be resolved: {first_line(err)}. "
            "Fix: define the referenced key or correct the ${...} expression."
        ) from None
    except RecursionError:
        raise UsageError(
            "an interpolation refers to itself or nests too deeply. Fix: correct the ${...} expressions."
        ) from None
    except Exception as err:  # a resolver's own error (e.g. div by zero), a value OmegaConf cannot hold
        raise UsageError(
            f"interpolation cannot be resolved ({type(err).__name__}: {first_line(err)}). "
            "Fix: correct the ${...} expression."
        ) from None


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> dict:
    """Load a NeMo-RL YAML with inheritance and overrides; return the fully resolved plain dict.

    Raises ``UsageError`` (one line) for a missing or unreadable file, a YAML syntax error (with
    line and column), a ``defaults`` cycle, a malformed override or one that targets a missing key
    without ``++``, an interpolation that cannot resolve, and any input over the limits in
    ``limits`` (file size, expanded node count, nesting, defaults chain, override size).
    """
    return finish_config(compose_config(path), overrides)


def compose_config(path: str | Path):
    """The file merged with its ``defaults:`` chain, unresolved (an OmegaConf ``DictConfig``), as
    NeMo-RL's ``load_config`` returns it; ``UsageError`` as ``load_config`` says."""
    return _load_with_inheritance(Path(path), (), _LoadState())


def finish_config(cfg, overrides: Iterable[str] = ()) -> dict:
    """Apply ``overrides`` to a composed config (in place) and resolve it to a plain dict, as the
    recipes do after ``load_config``; ``UsageError`` as ``load_config`` says."""
    overrides = list(overrides)
    if overrides:
        from nemo_rl_attn_align.config.overrides import apply_overrides

        apply_overrides(cfg, overrides)
    return _resolve(cfg)


def get_path(cfg: Any, dotted: str, default: Any = MISSING) -> Any:
    """Value at a dotted key (``"policy.megatron_cfg.attention_backend"``) of a plain nested dict.

    Returns ``default`` when a level is missing or is not a mapping; with no default, raises
    ``KeyError`` naming the dotted key.
    """
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is MISSING:
                raise KeyError(dotted)
            return default
        node = node[part]
    return node
