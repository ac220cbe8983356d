"""The model's Hugging Face ``config.json``, found on local disk only, and the identity it implies.

Both sides build the model from this file: Megatron-Bridge converts it into the TransformerConfig,
vLLM reads it as its ``hf_config``. ``check`` and ``drift`` therefore read it pre-flight, from a
local directory (``policy.model_name`` a path) or the local Hugging Face cache
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), never the network.
Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from nemo_rl_attn_align.contract.rope import canonical_rope
from nemo_rl_attn_align.contract.semantics import hf_left_window

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
    text = config.get("text_config")
    if isinstance(text, dict) and "num_attention_heads" in text:
        config = {**text, "architectures": config.get("architectures") or text.get("architectures")}
    return HFModelConfig(path, config)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _rope(hf: Mapping[str, Any]) -> tuple[str, dict]:
    """RoPE of a config.json: transformers >= 5 writes one ``rope_parameters`` dict, older files
    ``rope_theta`` and ``rope_scaling``."""
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping):
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        plain = set(scaling) <= {"rope_type"} and scaling.get("rope_type", "default") == "default"
        return canonical_rope(
            params.get("rope_theta"),
            params.get("partial_rotary_factor", hf.get("partial_rotary_factor")),
            None if plain else scaling,
        )
    return canonical_rope(hf.get("rope_theta"), hf.get("partial_rotary_factor"), hf.get("rope_scaling"))


def identity_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The identity fields a config.json fixes for both sides (fields it does not fix are left out).

    ``softmax_scale`` is ``query_pre_attn_scalar ** -0.5`` where the model has one (Gemma 2/3),
    else ``head_dim ** -0.5``; ``sliding_window`` is HF's window minus the query itself;
    ``layer_windows`` that window per layer (``layer_types``: ``sliding_attention`` or full);
    ``logit_softcapping`` is ``attn_logit_softcapping`` (None: none).
    """
    heads = _positive_int(hf.get("num_attention_heads"))
    out: dict[str, Any] = {}
    architectures = hf.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        out["architecture"] = architectures[0]
    for name, key in (
        ("num_layers", "num_hidden_layers"),
        ("num_attention_heads", "num_attention_heads"),
        ("vocab_size", "vocab_size"),
    ):
        if _positive_int(hf.get(key)):
            out[name] = hf[key]
    if heads:
        out["num_query_groups"] = _positive_int(hf.get("num_key_value_heads")) or heads
    hidden = _positive_int(hf.get("hidden_size"))
    head_dim = _positive_int(hf.get("head_dim")) or (hidden // heads if hidden and heads else None)
    if head_dim:
        out["head_dim"] = head_dim
        scalar = hf.get("query_pre_attn_scalar")
        base = scalar if isinstance(scalar, (int, float)) and not isinstance(scalar, bool) and scalar > 0 else head_dim
        out["softmax_scale"] = 1.0 / math.sqrt(base)
    layer_types = hf.get("layer_types")
    left = hf_left_window(hf.get("sliding_window"), hf.get("use_sliding_window"))
    if not (isinstance(layer_types, list) and len(set(map(str, layer_types))) > 1):  # mixed windows: per layer
        out["sliding_window"] = left
    layers = _positive_int(hf.get("num_hidden_layers"))
    if isinstance(layer_types, list) and layers and len(layer_types) == layers:
        out["layer_windows"] = [left if kind == "sliding_attention" else None for kind in layer_types]
    elif layers:
        out["layer_windows"] = [left] * layers
    cap = hf.get("attn_logit_softcapping")
    out["logit_softcapping"] = (
        float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    )
    out["rope_type"], out["rope_parameters"] = _rope(hf)
    return out
