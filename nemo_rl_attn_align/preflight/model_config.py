"""The model's Hugging Face ``config.json``, found on local disk only, and where it was looked for.

Both sides build the model from this file: Megatron-Bridge converts it into the TransformerConfig,
vLLM reads it as its ``hf_config``. ``check`` and ``drift`` therefore read it pre-flight, from a
local directory (``policy.model_name`` a path) or the local Hugging Face cache
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), never the network.
``not_found_line`` says where it was looked for and the command that fetches just that file.
Stdlib only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

CONFIG_NAME = "config.json"
#: A config.json larger than this is not a model config; it is skipped, not read.
MAX_CONFIG_BYTES = 4 << 20


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


def _cached_snapshot(model_name: str, cache: Path) -> Path | None:
    """``snapshots/<revision>/config.json`` of ``model_name`` in the hub cache: the revision ``refs/main``
    names, else the only snapshot present (several without a ref are ambiguous: None)."""
    repo = cache / ("models--" + model_name.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / CONFIG_NAME
        return candidate if candidate.is_file() else None
    snapshots = sorted((repo / "snapshots").glob(f"*/{CONFIG_NAME}")) if (repo / "snapshots").is_dir() else []
    return snapshots[0] if len(snapshots) == 1 else None


def find_config(model_name: Any, environ: Mapping[str, str] | None = None) -> Path | None:
    """The local ``config.json`` of ``policy.model_name``, or None when it is not on this machine."""
    if not isinstance(model_name, str) or not model_name.strip():
        return None
    environ = os.environ if environ is None else environ
    try:  # a name the file system cannot hold (too long, a NUL byte) is simply not on this machine
        local = Path(model_name).expanduser()
        if (local / CONFIG_NAME).is_file():
            return local / CONFIG_NAME
        if model_name.count("/") != 1 or model_name.startswith(("/", ".", "~")):
            return None
        return _cached_snapshot(model_name, hub_cache(environ))
    except (OSError, ValueError, RuntimeError):
        return None


def load_model_config(model_name: Any, environ: Mapping[str, str] | None = None) -> HFModelConfig | None:
    """The parsed ``config.json`` of ``model_name`` (its ``text_config`` for multimodal models), or
    None when it is absent, too large or not a JSON object (the engines report a broken model)."""
    path = find_config(model_name, environ)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return HFModelConfig(path, config)


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
