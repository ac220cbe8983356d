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

from pathlib import Path
from typing import Any, Iterable, Sequence

from nemo_rl_attn_align.errors import UsageError

#: Sentinel for ``get_path`` when no default is given.
MISSING = object()

#: The example ``check`` reads when no CONFIG is given.
DEFAULT_EXAMPLE = "grpo_math_1B_megatron_flash.yaml"


def default_example_path() -> Path:
    """Path of the packaged GRPO + Megatron + flash example config."""
    return Path(__file__).parent / "examples" / "configs" / DEFAULT_EXAMPLE


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
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
    return UsageError(f"{path}: YAML syntax error at {where}: {problem}. Fix the YAML at that position.")


def _load_one(path: Path):
    """One YAML file as a DictConfig, with its own errors turned into UsageError."""
    import yaml
    from omegaconf import DictConfig, OmegaConf

    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise UsageError(f"config file {path} {what}. Fix: pass the path of a NeMo-RL YAML file.")
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise _yaml_error(path, err) from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"config file {path} cannot be read: {err}. Fix: check the file's permissions and encoding.") from None
    except Exception as err:  # OmegaConf's own grammar errors (e.g. a bad key)
        raise UsageError(f"{path}: {type(err).__name__}: {str(err).splitlines()[0]}. Fix the YAML.") from None
    if not isinstance(cfg, DictConfig):
        raise UsageError(f"{path}: the top level is a {type(cfg).__name__}, not a mapping. Fix: a NeMo-RL config is a YAML mapping.")
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
        f"{path}: defaults={raw!r} is not a file name or a list of file names. "
        "Fix: write `defaults: parent.yaml` or a YAML list of paths."
    )


def _load_with_inheritance(path: Path, chain: tuple[Path, ...]):
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise UsageError(f"defaults cycle: {cycle}. Fix: remove one of these `defaults:` entries.")
    cfg = _load_one(path)
    if "defaults" not in cfg:
        return cfg
    from omegaconf import OmegaConf

    register_nemo_rl_resolvers()  # the recipes register them before loading; the merge reads values
    parents = _defaults_list(path, cfg.pop("defaults"))
    base = OmegaConf.create({})
    for parent in parents:
        parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
        base = _merge_with_override(base, _load_with_inheritance(parent_path, (*chain, resolved)), parent_path)
    return _merge_with_override(base, cfg, path)


def _apply_overrides(cfg, overrides: Sequence[str]) -> None:
    """Apply Hydra-style overrides in place, exactly as NeMo-RL's ``parse_hydra_overrides``."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    OmegaConf.set_struct(cfg, True)
    parser = OverridesParser.create()
    for text in overrides:
        try:
            parsed = parser.parse_overrides(overrides=[text])
        except HydraException as err:
            first = str(err).splitlines()[0]
            raise UsageError(
                f"override {text!r} is malformed ({first}). Fix: write key=value, ++key=value to add a key, ~key to delete one."
            ) from None
        override = parsed[0]
        if not override.key_or_group:
            raise UsageError(f"override {text!r} has no key. Fix: write key=value, ++key=value to add a key, ~key to delete one.")
        try:
            ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
        except (HydraException, OmegaConfBaseException) as err:
            first = str(err).splitlines()[0]
            raise UsageError(f"override {text!r} cannot be applied ({first}). Fix: {_override_hint(override)}.") from None


def _override_hint(override) -> str:
    key = override.key_or_group
    if override.is_delete():
        return f"{key} is not in the config, so there is nothing to delete; drop ~{key}"
    if override.is_add():
        return f"{key} is already in the config; write {key}=VALUE"
    if override.is_force_add():
        return f"check that the parent of {key} is a mapping and the value is valid"
    return f"{key} is not in the config; write ++{key}=VALUE to add it"


def _resolve(cfg) -> dict:
    """Resolve every interpolation; an unresolvable one becomes a UsageError naming its key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_nemo_rl_resolvers()
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        first = str(err).splitlines()[0]
        raise UsageError(
            f"interpolation at {key} cannot be resolved: {first}. Fix: define the referenced key or correct the ${{...}} expression."
        ) from None


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> dict:
    """Load a NeMo-RL YAML with inheritance and overrides; return the fully resolved plain dict.

    Raises ``UsageError`` (one line) for a missing file, a YAML syntax error (with line and column),
    a ``defaults`` cycle, a malformed override or one that targets a missing key without ``++``,
    and an interpolation that cannot resolve.
    """
    return finish_config(compose_config(path), overrides)


def compose_config(path: str | Path):
    """The file merged with its ``defaults:`` chain, unresolved (an OmegaConf ``DictConfig``), as
    NeMo-RL's ``load_config`` returns it; ``UsageError`` as ``load_config`` says."""
    return _load_with_inheritance(Path(path), ())


def finish_config(cfg, overrides: Iterable[str] = ()) -> dict:
    """Apply ``overrides`` to a composed config (in place) and resolve it to a plain dict, as the
    recipes do after ``load_config``; ``UsageError`` as ``load_config`` says."""
    overrides = list(overrides)
    if overrides:
        _apply_overrides(cfg, overrides)
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
