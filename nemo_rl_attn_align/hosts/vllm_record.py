"""The rollout side of the attention contract, read from a vLLM worker after its engine is up.

Everything is read with ``getattr`` from the objects vLLM hands the worker (``vllm_config`` and the
attention layers in ``compilation_config.static_forward_context``), so the same code reads the
vLLM versions NeMo-RL pinned (0.11.2 in v0.5.0, 0.17.1 in v0.6.0, 0.20.0 in v0.7.0, 0.25.1 at
7ea279a). The requested backend comes from ``vllm_config.attention_config.backend`` (the
``attention_backend`` engine argument, vLLM >= 0.13) or, when that is unset, the
``VLLM_ATTENTION_BACKEND`` variable (read by vLLM before 0.15); the chosen one is each attention
layer's ``attn_backend.get_name()``. The sliding window is each layer's ``impl.sliding_window``,
the ``(left, right)`` pair vLLM's FlashAttention/FlashInfer/Triton impls pass to the kernel
(``(sliding_window - 1, 0)``, ``(-1, -1)`` for none).
"""

from __future__ import annotations

import enum
from typing import Any, Mapping

from nemo_rl_attn_align.contract import AttentionContract, ContractBuilder
from nemo_rl_attn_align.hosts.worker_records import put_field
from nemo_rl_attn_align.rope import canonical_rope
from nemo_rl_attn_align.semantics import hf_left_window, left_window, vllm_semantics

VERSIONED = ("vllm", "torch", "flashinfer-python", "flash-attn", "triton")


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


def layer_windows(static_forward_context: Mapping[str, Any]) -> dict[str, int | None]:
    """Layer name -> the left window its attention impl passes to the kernel (None: no window);
    layers whose impl has no ``(left, right)`` ``sliding_window`` pair are skipped."""
    windows = {}
    for layer_name, layer in (static_forward_context or {}).items():
        pair = getattr(getattr(layer, "impl", None), "sliding_window", None)
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            windows[layer_name] = left_window(pair)
    return windows


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


def rollout_facts(vllm_config: Any, static_forward_context: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Plain JSON-ready facts about one vLLM worker's attention."""
    from nemo_rl_attn_align.determinism import vllm_batch_invariant

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
        **hf_rope(hf),
        "vocab_size": getattr(hf, "vocab_size", None),
        "tokenizer": getattr(model, "tokenizer", None),
        "dtype": _name(getattr(model, "dtype", None)),
        "kv_cache_dtype": _name(getattr(cache, "cache_dtype", None)),
        "block_size": getattr(cache, "block_size", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
        "max_num_seqs": getattr(sched, "max_num_seqs", None),
        "tensor_parallel_size": getattr(par, "tensor_parallel_size", None),
        "pipeline_parallel_size": getattr(par, "pipeline_parallel_size", None),
        "flash_attn_version": getattr(attn, "flash_attn_version", None),
        "batch_invariant": vllm_batch_invariant(environ),
    }


def hf_rope(hf: Any) -> dict[str, Any]:
    """RoPE facts of an HF config: ``rope_theta``, ``rope_scaling`` (None for plain RoPE), ``partial_rotary_factor``.

    transformers >= 5 keeps them in one ``rope_parameters`` dict (``{"rope_type": "default",
    "rope_theta": ...}``); older releases have ``rope_theta`` and ``rope_scaling`` attributes.
    """
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, Mapping):
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        plain = set(scaling) <= {"rope_type"} and scaling.get("rope_type", "default") == "default"
        return {"rope_theta": params.get("rope_theta"), "rope_scaling": None if plain else scaling,
                "partial_rotary_factor": params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))}
    return {"rope_theta": getattr(hf, "rope_theta", None), "rope_scaling": getattr(hf, "rope_scaling", None),
            "partial_rotary_factor": getattr(hf, "partial_rotary_factor", None)}


def _sliding_window(b: ContractBuilder, facts: Mapping[str, Any]) -> None:
    """The left window of the windowed layers, as their impls pass it to the kernel; HF's
    ``sliding_window - 1`` when no impl shows it."""
    windows = facts.get("layer_windows") or {}
    if not windows:
        value = hf_left_window(facts.get("sliding_window"), facts.get("use_sliding_window"))
        b.observed("sliding_window", value, "hf_config.sliding_window - 1 (no attention impl exposes sliding_window)")
        return
    windowed = sorted({w for w in windows.values() if w is not None})
    full = sum(w is None for w in windows.values())
    if len(windowed) > 1:
        b.unobservable("sliding_window", None, f"attention layers' impl.sliding_window[0] differ: {windowed}")
        return
    note = f" ({full} of {len(windows)} layers have no window)" if windowed and full else ""
    b.observed("sliding_window", windowed[0] if windowed else None, "attention layers' impl.sliding_window[0]" + note)


def rollout_contract(facts: Mapping[str, Any], worker_id: str, versions: Mapping[str, str] | None = None) -> AttentionContract:
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
    rope_type, rope_params = canonical_rope(facts.get("rope_theta"), facts.get("partial_rotary_factor"), facts.get("rope_scaling"))
    put("rope_type", rope_type, "hf_config.rope_scaling")
    put("rope_parameters", rope_params, "hf_config.rope_theta/partial_rotary_factor/rope_scaling")
    put("vocab_size", facts.get("vocab_size"), "hf_config.vocab_size")
    put("tokenizer", facts.get("tokenizer"), "model_config.tokenizer")
    put("dtype", facts.get("dtype"), "model_config.dtype")
    put("engine", "vllm", "vLLM worker", "observed")
    layers = facts.get("layer_backends") or {}
    distinct = sorted(set(layers.values()))
    if distinct:
        put("backend", distinct[0] if len(distinct) == 1 else dict(layers), "attention layers' attn_backend.get_name()")
    else:
        b.unobservable("backend", facts.get("requested_backend"), "no attention layer with attn_backend in static_forward_context")
    put("kv_page_size", facts.get("block_size"), "cache_config.block_size")
    put("kv_cache_dtype", facts.get("kv_cache_dtype"), "cache_config.cache_dtype")
    chunked = bool(facts.get("enable_chunked_prefill"))
    put("chunked_prefill_chunk", facts.get("max_num_batched_tokens") if chunked else None, "scheduler_config.max_num_batched_tokens", "observed" if chunked else "configured")
    put("prefix_caching", facts.get("enable_prefix_caching"), "cache_config.enable_prefix_caching")
    put("tp_size", facts.get("tensor_parallel_size"), "parallel_config.tensor_parallel_size")
    put("cp_size", 1, "vLLM prefill runs without context parallelism", "configured")
    put("cp_layout", "none", "cp_size == 1", "configured")
    put("cp_comm_type", None, "cp_size == 1", "configured")
    put("mode", "chunked_prefill+decode" if chunked else "prefill+decode", "scheduler_config.enable_chunked_prefill", "configured")
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
