"""The training side of the attention contract, read from a finished Megatron model config.

``model_config_facts`` turns the model config (a megatron-core ``TransformerConfig`` or a
Megatron-Bridge provider, which subclasses it) into a plain JSON-ready dict of every field that
decides what the attention computes; ``training_contract`` maps those facts, plus what Transformer
Engine was seen to choose (``te_readback``), onto ``contract.FIELDS``. No host library is imported
here: values are read with ``getattr`` from the objects the hooks hand over.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.contract.contract import (
    AttentionContract,
    ContractBuilder,
    put_field,
)
from nemo_rl_attn_align.contract.rope import canonical_rope, megatron_scaling
from nemo_rl_attn_align.contract.schema import ContractError, normalize_dtype
from nemo_rl_attn_align.contract.semantics import (  # te_semantics: the rule `check` previews with
    left_window,
    te_semantics,
)
from nemo_rl_attn_align.contract.tokenizer import tokenizer_identity
from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND

#: TransformerConfig / GPTModelProvider attributes recorded as they are (missing ones are listed).
MODEL_CONFIG_FIELDS = (
    "attention_backend",
    "transformer_impl",
    "params_dtype",
    "bf16",
    "fp16",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "softmax_scale",
    "attention_softmax_in_fp32",
    "window_size",
    "window_attn_skip_freq",
    "position_embedding_type",
    "rotary_base",
    "rotary_percent",
    "rotary_interleaved",
    "seq_len_interpolation_factor",
    "rope_scaling",
    "rope_scaling_factor",
    "apply_rope_fusion",
    "vocab_size",
    "tensor_model_parallel_size",
    "context_parallel_size",
    "pipeline_model_parallel_size",
    "cp_comm_type",
    "deterministic_mode",
    "batch_invariant_mode",
    "flash_attention_version",
)

#: Distributions whose versions go into every record (flash-attn 2, 3 and 4 under TE's names for them).
VERSIONED = (
    "torch",
    "megatron-core",
    "megatron-bridge",
    "transformer-engine",
    "flash-attn",
    "flash-attn-3",
    "flash-attn-4",
    "nemo-rl",
)


def _plain(value: Any) -> Any:
    """JSON-ready form of a config value: enums by name, dtypes as text, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return str(value)


def recorded_attributes(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``names`` of ``obj`` as JSON-ready values, and ``absent``: the names ``obj`` does not have."""
    missing = object()
    facts: dict[str, Any] = {"absent": []}
    for name in names:
        value = getattr(obj, name, missing)
        if value is missing:
            facts["absent"].append(name)
        else:
            facts[name] = _plain(value)
    return facts


def model_config_facts(model_cfg: Any, policy_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every attention-relevant field of the finished model config, plus the worker's batch sizes."""
    facts: dict[str, Any] = {
        "model_config_class": type(model_cfg).__name__,
        **recorded_attributes(model_cfg, MODEL_CONFIG_FIELDS),
    }
    policy_cfg = policy_cfg or {}
    for key in ("train_micro_batch_size", "logprob_batch_size"):
        if isinstance(policy_cfg.get(key), int):
            facts[key] = policy_cfg[key]
    tokenizer = policy_cfg.get("tokenizer")
    if isinstance(tokenizer, Mapping) and isinstance(tokenizer.get("name"), str):
        facts["tokenizer"] = tokenizer["name"]
    return facts


def _rope(facts: Mapping[str, Any]) -> tuple[str | None, dict | None]:
    kind = facts.get("position_embedding_type")
    if kind is None:
        return None, None
    if kind in ("none", "learned_absolute"):
        return "none", {}
    if kind != "rope":
        return kind, {"theta": facts.get("rotary_base")}
    return canonical_rope(facts.get("rotary_base"), facts.get("rotary_percent"), megatron_scaling(facts))


def megatron_layer_windows(facts: Mapping[str, Any]) -> list[int | None] | None:
    """Per-layer left windows as megatron-core's ``is_layer_window_attention`` decides them from
    ``window_size`` and ``window_attn_skip_freq`` (an int N: every N-th layer, 1-based, is full; a
    list: 1 = windowed); None when the facts do not tell."""
    layers, window, skip = (
        facts.get("num_layers"),
        left_window(facts.get("window_size")),
        facts.get("window_attn_skip_freq"),
    )
    if not isinstance(layers, int) or layers < 1 or "window_size" not in facts:
        return None
    if window is None or skip is None:
        return [window] * layers
    if isinstance(skip, int) and not isinstance(skip, bool) and skip > 0:
        return [None if number % skip == 0 else window for number in range(1, layers + 1)]
    if isinstance(skip, list) and len(skip) == layers:
        return [window if flag else None for flag in skip]
    return None


def _flash_attention_version(b: ContractBuilder, seen: Mapping[str, Any] | None, requested: Any, not_read: str) -> None:
    """The flash-attn major TE ran, as its read-back ``seen`` reports it; none when TE ran another backend."""
    if seen is None:
        b.unobservable(
            "flash_attention_version",
            requested,
            f"TE picks the flash-attn version when it selects the backend; {not_read}",
        )
    elif seen.get("backend") != "FlashAttention":
        b.observed("flash_attention_version", None, f"{seen.get('source')}: {seen.get('backend')} runs no flash-attn")
    else:
        put_field(
            b,
            "flash_attention_version",
            seen.get("flash_attention_version"),
            f"{seen.get('source')} ({seen.get('detail') or 'no version'})",
        )


def model_identity_fields(b: ContractBuilder, facts: Mapping[str, Any], src: str) -> None:
    """The identity fields the TransformerConfig (and the tokenizer) fix."""
    put_field(b, "num_layers", facts.get("num_layers"), src + "num_layers")
    put_field(b, "num_attention_heads", facts.get("num_attention_heads"), src + "num_attention_heads")
    put_field(b, "num_query_groups", facts.get("num_query_groups"), src + "num_query_groups")
    put_field(b, "head_dim", facts.get("kv_channels"), src + "kv_channels")
    if facts.get("softmax_scale") is not None:
        put_field(b, "softmax_scale", facts["softmax_scale"], src + "softmax_scale")
    elif facts.get("kv_channels"):
        put_field(
            b, "softmax_scale", 1.0 / math.sqrt(facts["kv_channels"]), f"1/sqrt({src}kv_channels) (softmax_scale unset)"
        )
    put_field(b, "causal", True, "GPTModel causal self-attention mask", "configured")
    if "window_size" in facts:
        b.observed("sliding_window", left_window(facts["window_size"]), f"{src}window_size[0] (-1 or None: no window)")
    else:
        b.unobservable("sliding_window", None, f"{src}window_size not recorded")
    put_field(
        b, "layer_windows", megatron_layer_windows(facts), f"{src}window_size and window_attn_skip_freq per layer"
    )
    put_field(
        b,
        "logit_softcapping",
        None,
        "megatron-core's TransformerConfig has no attention logit soft capping",
        "configured",
    )
    put_field(b, "decode_cp_size", None, "training does not decode", "configured")
    rope_type, rope_params = _rope(facts)
    put_field(b, "rope_type", rope_type, src + "position_embedding_type")
    put_field(b, "rope_parameters", rope_params, src + "rotary_base/rotary_percent/rope_scaling")
    put_field(b, "vocab_size", facts.get("vocab_size"), src + "vocab_size")
    if facts.get("tokenizer"):
        identity, how = tokenizer_identity(facts["tokenizer"])
        put_field(b, "tokenizer", identity, f"policy.tokenizer.name: {how}", "configured")


def _parallel_fields(b: ContractBuilder, facts: Mapping[str, Any], src: str) -> int:
    """Parallelism, batch and mode fields; returns the context-parallel size."""
    cp_size = facts.get("context_parallel_size") or 1
    put_field(b, "cp_size", cp_size, src + "context_parallel_size")
    put_field(
        b,
        "cp_comm_type",
        facts.get("cp_comm_type") if cp_size > 1 else None,
        src + "cp_comm_type",
        "configured" if cp_size == 1 else "observed",
    )
    put_field(
        b,
        "cp_layout",
        "load_balanced" if cp_size > 1 else "none",
        "TE CP load-balanced sequence split" if cp_size > 1 else "cp_size == 1",
        "configured",
    )
    put_field(b, "tp_size", facts.get("tensor_model_parallel_size"), src + "tensor_model_parallel_size")
    put_field(b, "mode", "prefill", "training scores whole sequences", "configured")
    put_field(b, "rope_fusion", facts.get("apply_rope_fusion"), src + "apply_rope_fusion")
    batch_key = "logprob_batch_size" if "logprob_batch_size" in facts else "train_micro_batch_size"
    if batch_key in facts:
        put_field(b, "physical_batch", facts[batch_key], f"policy.{batch_key}", "configured")
    for name, key in (("batch_invariant", "batch_invariant_mode"), ("deterministic", "deterministic_mode")):
        if key in facts.get("absent", ()):
            b.unobservable(name, None, f"{src}{key} does not exist in this megatron-core")
        else:
            put_field(b, name, facts.get(key), src + key)
    return cp_size


def _backend_fields(
    b: ContractBuilder, facts: Mapping[str, Any], src: str, seen: Mapping[str, Any] | None, not_read: str, cp_size: int
) -> None:
    """The backend, engine and dtype, and the semantics they imply (by the rule ``check`` previews with)."""
    requested = facts.get("attention_backend")
    backend = seen["backend"] if seen else TE_CLASS_BY_BACKEND.get(requested) if isinstance(requested, str) else None
    # The reduction semantics (and reduction_engine, split_kv_policy, no KV cache) follow from
    # backend, dtype and CP by the same rule `check` previews with.
    names = {cls: name for name, cls in TE_CLASS_BY_BACKEND.items()}
    attn_backend = names.get(backend, requested) if isinstance(backend, str) else requested
    try:
        dtype = normalize_dtype(facts.get("params_dtype"))
    except ContractError:
        dtype = None
    te_semantics(b, attn_backend, dtype, cp_size, facts.get("cp_comm_type") or "p2p", preview=False)
    put_field(b, "dtype", facts.get("params_dtype"), src + "params_dtype")
    if seen:
        put_field(b, "backend", backend, seen.get("source", "read back"))
        put_field(b, "engine", seen.get("engine"), seen.get("source", "read back"))
    else:
        b.unobservable("backend", requested, f"requested AttnBackend.{requested}; {not_read}")
        b.unobservable("engine", None, not_read)


def training_contract(
    facts: Mapping[str, Any],
    worker_id: str,
    observed: Mapping[str, Any] | None = None,
    versions: Mapping[str, str] | None = None,
) -> AttentionContract:
    """The training-side contract for one worker.

    ``observed`` is ``te_readback``'s result (``backend``, ``engine``, ``status``, ``source``,
    ``flash_attention_version``); without it the backend is what the config requested, recorded as
    not yet observed. Any ``facts`` (even ``{}``) give a whole contract.
    """
    b = ContractBuilder("training", worker_id)
    src = f"{facts.get('model_config_class', 'TransformerConfig')}."
    seen = observed if observed and observed.get("status") == "observed" else None
    not_read = (observed or {}).get("source") or "not read back yet (before the first forward)"
    model_identity_fields(b, facts, src)
    cp_size = _parallel_fields(b, facts, src)
    _flash_attention_version(b, seen, facts.get("flash_attention_version"), not_read)
    _backend_fields(b, facts, src, seen, not_read, cp_size)
    if versions:
        put_field(b, "versions", dict(versions), "importlib.metadata", "observed")
    return b.build(unset_source="not known to the Megatron worker at setup")
