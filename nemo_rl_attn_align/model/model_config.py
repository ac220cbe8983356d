"""The model's Hugging Face ``config.json``, found on local disk only, read within limits.

Both sides build the model from this file: Megatron-Bridge converts it into the TransformerConfig,
vLLM reads it as its ``hf_config``. ``check`` and ``drift`` therefore read it pre-flight, from a
local directory (``policy.model_name`` a path) or the local Hugging Face cache
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), never the network.
``load_model_config`` gives the file's contents or ``ConfigNotRead``, which says which of four things
happened: it is not on this machine (where it was looked for and the command that fetches just that
file), it cannot be read, it is not JSON, or a value the hosts' readings use breaks a limit of
``vocab.limits`` (``model_value_problem``: each attention-relevant number an integer in its range,
booleans and mappings where they are meant). Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import (
    MAX_MODEL_CONFIG_BYTES,
    MAX_MODEL_LAYERS,
    MODEL_INTEGERS,
    MODEL_NUMBERS,
    InputRefused,
    first_line,
    integer_problem,
    kind_of,
    number_problem,
    read_text,
    shown,
    shown_path,
)

CONFIG_NAME = "config.json"
#: Where a config.json holds the text model's values: the top level, and the text part of a
#: multimodal model (``text_config``; Qwen-Omni's ``thinker_config.text_config``).
TEXT_LEVELS = ("", "text_config", "thinker_config.text_config")
#: Of ``MODEL_INTEGERS``, those no host builds a model without (null is refused).
REQUIRED_INTEGERS = ("num_hidden_layers", "num_layers", "num_attention_heads", "hidden_size")
#: Per-layer lists or patterns (one entry a layer): at most ``MAX_MODEL_LAYERS`` entries.
PER_LAYER = ("layer_types", "layers_block_type", "hybrid_override_pattern", "hybrid_layer_pattern")
#: Keys that are true/false (or null) where the hosts read them.
FLAGS = ("use_sliding_window",)
#: Keys that are a mapping (or null) where the hosts read them; ``rope_parameters``' own numbers are
#: checked like the top level's.
MAPPINGS = ("rope_scaling", "rope_parameters", "text_config")
#: The largest ``refs/main`` of a hub cache read (a 40-character commit hash and a newline).
MAX_REF_BYTES = 256


class HFModelConfig(NamedTuple):
    """A model's ``config.json`` (the text part for multimodal models) and where it was read."""

    path: Path
    config: dict


def hub_cache(environ: Mapping[str, str]) -> Path:
    """The local Hugging Face hub cache, as ``huggingface_hub`` resolves it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


class ConfigNotRead(NamedTuple):
    """Why no ``config.json`` was read: ``line`` says it in one line; ``missing`` when it is not on
    this machine (the engines fetch it; ``check`` notes it), else it is there but unreadable,
    not JSON or over a limit (``check`` stops: exit 2)."""

    line: str
    missing: bool


def _cached_snapshot(model_name: str, cache: Path) -> Path | None:
    """``snapshots/<revision>/config.json`` of ``model_name`` in the hub cache: the revision ``refs/main``
    names, else the only snapshot present (several without a ref are ambiguous: None). The path is
    given where anything is there (a directory or an unreadable file too: the reader says what)."""
    repo = cache / ("models--" + model_name.replace("/", "--"))
    ref = repo / "refs" / "main"
    try:
        revision = read_text(ref, MAX_REF_BYTES, "hub cache ref").strip()
    except (OSError, ValueError):  # no ref (or a broken one): the snapshots themselves decide
        revision = ""
    if revision:
        candidate = repo / "snapshots" / revision / CONFIG_NAME
        return candidate if os.path.lexists(candidate) else None
    snapshots = sorted((repo / "snapshots").glob(f"*/{CONFIG_NAME}")) if (repo / "snapshots").is_dir() else []
    return snapshots[0] if len(snapshots) == 1 else None


def find_config(model_name: Any, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the ``config.json`` of ``policy.model_name`` is on this machine (whether or not it can
    be read), or None when nothing is there."""
    if not isinstance(model_name, str) or not model_name.strip():
        return None
    environ = os.environ if environ is None else environ
    try:  # a name the file system cannot hold (too long, a NUL byte) is simply not on this machine
        local = Path(model_name).expanduser()
        if os.path.lexists(local / CONFIG_NAME):
            return local / CONFIG_NAME
        if model_name.count("/") != 1 or model_name.startswith(("/", ".", "~")):
            return None
        return _cached_snapshot(model_name, hub_cache(environ))
    except (OSError, ValueError, RuntimeError):
        return None


def load_model_config(model_name: Any, environ: Mapping[str, str] | None = None) -> HFModelConfig | ConfigNotRead:
    """The parsed ``config.json`` of ``model_name``, or why it was not read (``ConfigNotRead``): not on
    this machine, unreadable, not a JSON object, or a value over a limit (``config_problems``)."""
    environ = os.environ if environ is None else environ
    path = find_config(model_name, environ)
    if path is None:
        return ConfigNotRead(not_found_line(model_name, environ), missing=True)
    where = f"policy.model_name={shown(model_name)}: {CONFIG_NAME} {shown_path(path)}"
    fix = _refetch(model_name)
    try:
        config = jsonio.read_json_file(path, MAX_MODEL_CONFIG_BYTES, CONFIG_NAME, strict=False)  # as the hosts read it
    except InputRefused as err:
        return ConfigNotRead(f"policy.model_name={shown(model_name)}: {err}. Fix: {fix}", missing=False)
    except OSError as err:
        return ConfigNotRead(f"{where} cannot be read ({err.strerror or err}). Fix: {fix}", missing=False)
    except ValueError as err:  # UnicodeDecodeError too
        return ConfigNotRead(f"{where} is not valid JSON ({first_line(err)}). Fix: {fix}", missing=False)
    if not isinstance(config, dict):
        return ConfigNotRead(f"{where} holds {kind_of(config)}, not a JSON object. Fix: {fix}", missing=False)
    problem = next(config_problems(config), None)
    if problem is not None:
        key, value, why = problem
        return ConfigNotRead(
            f"{where}: {key}={shown(value)} {why} (README: Limits on input); neither host can build this model. "
            f"Fix: correct {key} there, or {fix}",
            missing=False,
        )
    return HFModelConfig(path, config)


def _refetch(model_name: Any) -> str:
    """How to get a good copy of ``model_name``'s config.json."""
    if isinstance(model_name, str) and model_name.count("/") == 1 and not model_name.startswith(("/", ".", "~")):
        return f"fetch it anew: hf download {model_name} {CONFIG_NAME}"
    return f"point policy.model_name at a checkpoint directory with a readable {CONFIG_NAME}"


def model_value_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the model's ``name`` (a config.json key, or a TransformerConfig attribute
    that ``model_overrides`` sets) by ``vocab.limits``, or None (also for a name no reading uses)."""
    if name in MODEL_INTEGERS:
        return None if value is None and name not in REQUIRED_INTEGERS else integer_problem(value, MODEL_INTEGERS[name])
    if value is None:
        return None
    if name in MODEL_NUMBERS:
        return number_problem(value, *MODEL_NUMBERS[name])
    if name in PER_LAYER:
        if not isinstance(value, (list, str)):
            return f"is {kind_of(value)}, not a per-layer list or pattern"
        if len(value) > MAX_MODEL_LAYERS:
            return f"has {len(value)} entries, over the limit of {MAX_MODEL_LAYERS} layers"
    if name in FLAGS and not isinstance(value, bool):
        return f"is {kind_of(value)}, not true or false"
    if name in MAPPINGS and not isinstance(value, Mapping):
        return f"is {kind_of(value)}, not a mapping"
    return None


def config_problems(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(dotted key, value, why)`` of each value of ``config`` (a config.json, or the overrides set
    on one) that breaks a limit: the text model's levels (``TEXT_LEVELS``) and their ``rope_parameters``."""
    for level in TEXT_LEVELS:
        node: Any = config
        for part in level.split(".") if level else ():
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            continue
        where = f"{prefix}{level}." if level else prefix
        for name in (*MODEL_INTEGERS, *MODEL_NUMBERS, *PER_LAYER, *FLAGS, *MAPPINGS):
            if name in node and (why := model_value_problem(name, node[name])) is not None:
                yield f"{where}{name}", node[name], why
        rope = node.get("rope_parameters")
        if isinstance(rope, Mapping):
            for name in MODEL_NUMBERS:
                if name in rope and (why := model_value_problem(name, rope[name])) is not None:
                    yield f"{where}rope_parameters.{name}", rope[name], why


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's part of a config (``text_config`` for multimodal models), with the
    checkpoint's ``architectures``."""
    text = config.get("text_config")
    if isinstance(text, dict) and "num_attention_heads" in text:
        return {**text, "architectures": config.get("architectures") or text.get("architectures")}
    return config


def not_found_line(model_name: Any, environ: Mapping[str, str] | None = None) -> str:
    """Where ``policy.model_name``'s ``config.json`` was looked for, and how to fetch just that file."""
    environ = os.environ if environ is None else environ
    if not isinstance(model_name, str) or not model_name.strip():
        return "policy.model_name is not set, so no config.json was looked for"
    local = Path(model_name).expanduser() / CONFIG_NAME
    if model_name.count("/") != 1 or model_name.startswith(("/", ".", "~")):
        return f"policy.model_name={model_name!r}: no {local} on this machine"
    repo = hub_cache(environ) / ("models--" + model_name.replace("/", "--"))
    return (
        f"policy.model_name={model_name!r}: no config.json on this machine (looked for {local} and in the "
        f"Hugging Face cache {repo}); fetch just that file: hf download {model_name} config.json"
    )
