"""The training side of the attention contract: a Megatron worker's ``ModelConfigSnapshot``
(``megatron_snapshot.read_model_config``) and what Transformer Engine was seen to choose
(``te_readback``), mapped onto the contract fields. No host library is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.contract.attention_identity import model_identity
from nemo_rl_attn_align.contract.contract import (
    AttentionContract,
    ContractBuilder,
    FieldValue,
    put_field,
)
from nemo_rl_attn_align.contract.megatron_snapshot import ModelConfigSnapshot
from nemo_rl_attn_align.contract.rope import canonical_rope, megatron_scaling
from nemo_rl_attn_align.contract.semantics import te_semantics  # the rule `check` previews with
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import HostModel, left_window, megatron_model
from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND
from nemo_rl_attn_align.preflight.tokenizer import tokenizer_identity
from nemo_rl_attn_align.vocab.schema import ContractError, normalize_dtype

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


def _rope(snap: ModelConfigSnapshot) -> tuple[str | None, dict | None]:
    kind = snap.position_embedding_type
    if kind is None:
        return None, None
    if kind in ("none", "learned_absolute"):
        return "none", {}
    if kind == "yarn" and snap.yarn_rotary_scaling_factor is not None:
        return canonical_rope(snap.rotary_base, snap.rotary_percent, _yarn_scaling(snap))
    if kind != "rope":
        return kind, {"theta": snap.rotary_base}
    return canonical_rope(
        snap.rotary_base,
        snap.rotary_percent,
        megatron_scaling(snap.rope_scaling, snap.rope_scaling_factor, snap.seq_len_interpolation_factor),
    )


def _yarn_scaling(snap: ModelConfigSnapshot) -> dict[str, Any]:
    """A Megatron-Bridge provider's YaRN fields as Hugging Face's ``rope_parameters`` name them;
    ``truncate``: whether megatron-core rounds the correction band (``round_to_int``; None does not)."""
    fields = {
        "factor": snap.yarn_rotary_scaling_factor,
        "original_max_position_embeddings": snap.yarn_original_max_position_embeddings,
        "beta_fast": snap.yarn_beta_fast,
        "beta_slow": snap.yarn_beta_slow,
        "mscale": snap.yarn_mscale,
        "mscale_all_dim": snap.yarn_mscale_all_dim,
    }
    truncate = bool(snap.yarn_correction_range_round_to_int)
    return {"rope_type": "yarn", **{k: v for k, v in fields.items() if v is not None}, "truncate": truncate}


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


def _attention_layers(b: ContractBuilder, snap: ModelConfigSnapshot, src: str) -> None:
    """The attention layers' identity, laid out by megatron-core's rules from the config's attributes
    (``model_attention.megatron_model``: the preview's mapping, through ``attention_identity``)."""
    built = megatron_model(snap.attributes(), "Megatron", f"{src[:-1]} attributes, laid out per layer")
    if isinstance(built, HostModel):
        model_identity(b, built, "observed")
    else:  # a config that does not lay out its layers: what it does show, field by field
        why = f"{src[:-1]}: {built}" if snap.was_read() else f"{src[:-1]} was not read"
        model_identity(b, NotRead(why), "observed")
        put_field(b, "num_layers", snap.num_layers, src + "num_layers")
        put_field(b, "num_attention_heads", snap.num_attention_heads, src + "num_attention_heads")
        put_field(b, "num_query_groups", snap.num_query_groups, src + "num_query_groups")
        put_field(b, "head_dim", snap.kv_channels, src + "kv_channels")
        if snap.has("window_size"):
            b.observed("sliding_window", left_window(snap.window_size), f"{src}window_size[0] (-1 or None: no window)")
    if snap.softmax_scale is not None:
        put_field(b, "softmax_scale", snap.softmax_scale, src + "softmax_scale")
    elif snap.multi_latent_attention:
        b.unobservable("softmax_scale", None, f"{src}softmax_scale unset: MLA's scale (YaRN mscale) is its own")
    elif snap.kv_channels:
        put_field(
            b, "softmax_scale", 1.0 / math.sqrt(snap.kv_channels), f"1/sqrt({src}kv_channels) (softmax_scale unset)"
        )


def model_identity_fields(b: ContractBuilder, snap: ModelConfigSnapshot, src: str) -> None:
    """The identity fields the TransformerConfig (and the tokenizer) fix."""
    _attention_layers(b, snap, src)
    put_field(b, "causal", True, "GPTModel causal self-attention mask", "configured")
    put_field(
        b,
        "logit_softcapping",
        None,
        "megatron-core's TransformerConfig has no attention logit soft capping",
        "configured",
    )
    put_field(b, "decode_cp_size", None, "training does not decode", "configured")
    rope_type, rope_params = _rope(snap)
    put_field(b, "rope_type", rope_type, src + "position_embedding_type")
    scaling = "yarn_*" if rope_type == "yarn" else "rope_scaling"
    put_field(b, "rope_parameters", rope_params, src + f"rotary_base/rotary_percent/{scaling}")
    put_field(b, "vocab_size", snap.vocab_size, src + "vocab_size")
    if snap.tokenizer:
        tokenizer = tokenizer_identity(snap.tokenizer)
        put_field(b, "tokenizer", tokenizer.identity, f"policy.tokenizer.name: {tokenizer.how}", "configured")


def _parallel_fields(b: ContractBuilder, snap: ModelConfigSnapshot, src: str) -> int:
    """Parallelism, batch and mode fields; returns the context-parallel size."""
    cp_size = snap.context_parallel_size or 1
    put_field(b, "cp_size", cp_size, src + "context_parallel_size")
    put_field(
        b,
        "cp_comm_type",
        snap.cp_comm_type if cp_size > 1 else None,
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
    put_field(b, "tp_size", snap.tensor_model_parallel_size, src + "tensor_model_parallel_size")
    put_field(b, "mode", "prefill", "training scores whole sequences", "configured")
    put_field(b, "rope_fusion", snap.apply_rope_fusion, src + "apply_rope_fusion")
    batch_key = "logprob_batch_size" if snap.logprob_batch_size is not None else "train_micro_batch_size"
    if getattr(snap, batch_key) is not None:
        put_field(b, "physical_batch", getattr(snap, batch_key), f"policy.{batch_key}", "configured")
    for name, key in (("batch_invariant", "batch_invariant_mode"), ("deterministic", "deterministic_mode")):
        if not snap.has(key):
            why = "does not exist in this megatron-core" if snap.was_read() else "was not read"
            b.unobservable(name, None, f"{src}{key} {why}")
        else:
            put_field(b, name, getattr(snap, key), src + key)
    return cp_size


def _backend_fields(
    b: ContractBuilder, snap: ModelConfigSnapshot, src: str, seen: Mapping[str, Any] | None, not_read: str, cp_size: int
) -> None:
    """The backend, engine and dtype, and the semantics they imply (by the rule ``check`` previews with)."""
    requested = snap.attention_backend
    backend = seen["backend"] if seen else TE_CLASS_BY_BACKEND.get(requested) if isinstance(requested, str) else None
    # The reduction semantics (and reduction_engine, split_kv_policy, no KV cache) follow from
    # backend, dtype and CP by the same rule `check` previews with.
    names = {cls: name for name, cls in TE_CLASS_BY_BACKEND.items()}
    attn_backend = names.get(backend, requested) if isinstance(backend, str) else requested
    try:
        dtype = normalize_dtype(snap.params_dtype)
    except ContractError:
        dtype = None
    te_semantics(b, attn_backend, dtype, cp_size, snap.cp_comm_type or "p2p", preview=False)
    put_field(b, "dtype", snap.params_dtype, src + "params_dtype")
    if seen:
        put_field(b, "backend", backend, seen.get("source", "read back"))
        put_field(b, "engine", seen.get("engine"), seen.get("source", "read back"))
    else:
        b.unobservable("backend", requested, f"requested AttnBackend.{requested}; {not_read}")
        b.unobservable("engine", None, not_read)


def training_contract(
    snapshot: ModelConfigSnapshot | None,
    worker_id: str,
    observed: Mapping[str, Any] | None = None,
    versions: Mapping[str, str] | None = None,
    behaviour: Mapping[str, FieldValue] | None = None,
) -> AttentionContract:
    """The training-side contract for one worker.

    ``observed`` is ``te_readback``'s result (``backend``, ``engine``, ``status``, ``source``,
    ``flash_attention_version``); without it the backend is what the config requested, recorded as
    not yet observed. ``behaviour``: the fields ``rope``, ``mask`` and ``softmax`` as
    ``hosts.megatron_behaviour`` read them from the built model (before it is built: unobservable).
    ``snapshot`` None (the model config could not be read) still gives a whole contract.
    """
    b = ContractBuilder("training", worker_id)
    snapshot = snapshot if snapshot is not None else ModelConfigSnapshot.unread()
    src = f"{snapshot.config_class}."
    seen = observed if observed and observed.get("status") == "observed" else None
    not_read = (observed or {}).get("source") or "not read back yet (before the first forward)"
    model_identity_fields(b, snapshot, src)
    cp_size = _parallel_fields(b, snapshot, src)
    _flash_attention_version(b, seen, snapshot.flash_attention_version, not_read)
    _backend_fields(b, snapshot, src, seen, not_read, cp_size)
    if versions:
        put_field(b, "versions", dict(versions), "importlib.metadata", "observed")
    for name, value in (behaviour or {}).items():
        b.set(name, value)
    return b.build(unset_source="not known to the Megatron worker at setup")
