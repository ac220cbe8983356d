"""What one vLLM worker's engine runs, read once after it is up: a frozen ``VllmSnapshot``.

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
Soft capping is ``impl.logits_soft_cap`` (0 or None: none). Each layer's attention module (its
heads, head sizes, window, sinks, MLA ranks) is read as ``hosts.model_readers`` reads vLLM's model
before the run (``model_attention.vllm_layer_facts``), so the record and the preview share one
mapping. The KV cache is each attention layer's
``kv_cache_dtype`` name (vLLM resolves it from ``cache_config.cache_dtype``, a checkpoint's KV-cache
scheme and ``kv_cache_dtype_skip_layers``) and the dtype of the cache tensor the first layer holds.
The context-parallel sizes are ``parallel_config.prefill_context_parallel_size`` and
``decode_context_parallel_size`` (vLLM >= 0.12; none before).

``contract.rollout.rollout_contract`` maps a snapshot onto the contract fields; the hook keeps its
``to_dict()`` in the worker's host detail. No host library is imported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.contract.megatron_snapshot import plain
from nemo_rl_attn_align.contract.rope import hf_rope
from nemo_rl_attn_align.model.model_attention import hf_left_window, left_window, vllm_layer_facts
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant

_NOT_REQUESTED = "not requested (vLLM selects by platform)"


@dataclass(frozen=True)
class VllmSnapshot:
    """One vLLM engine's attention as its worker saw it after warm-up (None: not exposed by this vLLM).

    Per-layer values are keyed by the attention layer's name in ``static_forward_context``."""

    requested_backend: str | None = None
    requested_source: str = _NOT_REQUESTED
    layer_backends: Mapping[str, str] = field(default_factory=dict)  # layer -> attn_backend.get_name()
    architecture: str | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_size: int | None = None
    softmax_scale: float | None = None
    sliding_window: int | None = None  # HF's, counting the query itself
    use_sliding_window: bool | None = None
    layer_windows: Mapping[str, int | None] = field(default_factory=dict)  # layer -> left window its impl passes
    #: layer index -> its attention module's facts (``model_attention.vllm_layer_facts``); JSON keys are text.
    layer_attention: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    hf_layer_windows: list[int | None] | None = None  # from hf_config.layer_types
    layer_soft_caps: list[float | None] = field(default_factory=list)
    attn_logit_softcapping: float | None = None
    rope_theta: float | None = None
    rope_scaling: Mapping[str, Any] | None = None
    partial_rotary_factor: float | None = None
    rope_source: str | None = None  # the HF attribute the RoPE values were read from
    vocab_size: int | None = None
    tokenizer: str | None = None
    dtype: str | None = None  # model_config.dtype, as text
    kv_cache_dtype: str | None = None  # cache_config.cache_dtype as configured
    layer_kv_cache_dtypes: Mapping[str, str] = field(default_factory=dict)  # layer -> its kv_cache_dtype
    kv_cache_tensor_dtype: str | None = None  # the first allocated cache tensor's dtype
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    prefill_context_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    flash_attn_version: int | None = None
    #: the flash-attn generation the FLASH_ATTN layers call (``impl.vllm_flash_attn_version``), where they agree
    impl_flash_attn_version: int | None = None
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT in the worker

    def chosen_backends(self) -> list[str]:
        """The distinct backends the attention layers run, sorted."""
        return sorted(set(self.layer_backends.values()))

    def model_parallel_size(self) -> int:
        """Tensor x pipeline parallel workers of one engine (1 where vLLM did not say)."""
        return (self.tensor_parallel_size or 1) * (self.pipeline_parallel_size or 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, one key per field (the worker's host detail keeps it as ``vllm_config``)."""
        return dataclasses.asdict(self)


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


def layer_kv_cache_dtypes(static_forward_context: Mapping[str, Any]) -> dict[str, str]:
    """Attention layer name -> the ``kv_cache_dtype`` name it stores its cache in (vLLM's
    ``Attention.kv_cache_dtype``, after ``auto``, skip layers and a checkpoint's scheme are applied)."""
    names = {}
    for layer_name, layer in (static_forward_context or {}).items():
        value = getattr(layer, "kv_cache_dtype", None)
        if hasattr(layer, "attn_backend") and isinstance(value, str) and value:
            names[layer_name] = value
    return names


def kv_cache_tensor_dtype(static_forward_context: Mapping[str, Any]) -> str | None:
    """The dtype of the KV cache the first attention layer holds (None before allocation)."""
    for layer in (static_forward_context or {}).values():
        cache = getattr(layer, "kv_cache", None)
        if isinstance(cache, (list, tuple)):
            cache = cache[0] if cache else None
        dtype = getattr(cache, "dtype", None)
        if dtype is not None and getattr(cache, "numel", lambda: 0)():
            return str(dtype)
    return None


def impl_soft_cap(cap: Any) -> float | None:
    """An impl's ``logits_soft_cap`` as a number (None where it caps nothing: 0, None or not a number)."""
    return float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None


def layer_soft_caps(static_forward_context: Mapping[str, Any]) -> list[float | None]:
    """Each attention impl's ``logits_soft_cap`` (``impl_soft_cap``)."""
    caps = []
    for layer in (static_forward_context or {}).values():
        impl = getattr(layer, "impl", None)
        if impl is not None and hasattr(impl, "logits_soft_cap"):
            caps.append(impl_soft_cap(impl.logits_soft_cap))
    return caps


def requested_backend(vllm_config: Any, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The backend the engine was asked for, and where that request was read: the engine argument
    when set, else ``VLLM_ATTENTION_BACKEND`` (vLLM 0.13 and 0.14 have ``attention_config`` and
    still read the variable when the argument is unset)."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is not None:
        return plain(backend), "vllm_config.attention_config.backend (attention_backend engine arg)"
    if environ.get("VLLM_ATTENTION_BACKEND"):
        return environ["VLLM_ATTENTION_BACKEND"], "VLLM_ATTENTION_BACKEND"
    return None, _NOT_REQUESTED


def _model_values(
    model: Any, static_forward_context: Mapping[str, Any], modules: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The model's shape, window, soft cap, RoPE and tokenizer, from ``model_config`` and the layers."""
    hf = getattr(model, "hf_config", None)
    first = next((layer for layer in (static_forward_context or {}).values() if hasattr(layer, "attn_backend")), None)
    get_head_size = getattr(model, "get_head_size", None)
    return {
        "architecture": (getattr(hf, "architectures", None) or [None])[0],
        "num_layers": getattr(hf, "num_hidden_layers", None),
        "num_attention_heads": getattr(hf, "num_attention_heads", None),
        "num_key_value_heads": getattr(hf, "num_key_value_heads", None),
        "head_size": get_head_size() if callable(get_head_size) else None,
        "softmax_scale": getattr(getattr(first, "impl", None), "scale", None),
        "sliding_window": getattr(hf, "sliding_window", None),
        "use_sliding_window": getattr(hf, "use_sliding_window", None),
        "layer_windows": layer_windows(static_forward_context),
        "layer_attention": {
            str(index): facts
            for index, facts in vllm_layer_facts(list((static_forward_context or {}).items()), None, modules).items()
        },
        "hf_layer_windows": hf_layer_windows(hf),
        "layer_soft_caps": layer_soft_caps(static_forward_context),
        "attn_logit_softcapping": getattr(hf, "attn_logit_softcapping", None),
        **hf_rope(hf),
        "vocab_size": getattr(hf, "vocab_size", None),
        "tokenizer": getattr(model, "tokenizer", None),
        "dtype": plain(getattr(model, "dtype", None)),
    }


def _chunked_prefill(sched: Any) -> bool | None:
    """``scheduler_config.enable_chunked_prefill`` (``chunked_prefill_enabled`` in older vLLM)."""
    return getattr(sched, "enable_chunked_prefill", getattr(sched, "chunked_prefill_enabled", None))


def _engine_values(vllm_config: Any, static_forward_context: Mapping[str, Any]) -> dict[str, Any]:
    """The KV cache, scheduler and parallel settings the engine runs with."""
    cache = getattr(vllm_config, "cache_config", None)
    sched = getattr(vllm_config, "scheduler_config", None)
    par = getattr(vllm_config, "parallel_config", None)
    return {
        "kv_cache_dtype": plain(getattr(cache, "cache_dtype", None)),
        "layer_kv_cache_dtypes": layer_kv_cache_dtypes(static_forward_context),
        "kv_cache_tensor_dtype": kv_cache_tensor_dtype(static_forward_context),
        "block_size": getattr(cache, "block_size", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "enable_chunked_prefill": _chunked_prefill(sched),
        "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
        "max_num_seqs": getattr(sched, "max_num_seqs", None),
        "tensor_parallel_size": getattr(par, "tensor_parallel_size", None),
        "pipeline_parallel_size": getattr(par, "pipeline_parallel_size", None),
        "prefill_context_parallel_size": getattr(par, "prefill_context_parallel_size", None),
        "decode_context_parallel_size": getattr(par, "decode_context_parallel_size", None),
        "flash_attn_version": getattr(getattr(vllm_config, "attention_config", None), "flash_attn_version", None),
        "impl_flash_attn_version": impl_flash_attn_version(static_forward_context),
    }


def impl_flash_attn_version(static_forward_context: Mapping[str, Any]) -> int | None:
    """The flash-attn generation vLLM's FlashAttention impls call (``vllm_flash_attn_version``, set by
    ``fa_utils.get_flash_attn_version`` when the layer is built), when every such layer says one and the same."""
    impls = [getattr(layer, "impl", None) for layer in static_forward_context.values()]
    found = {getattr(impl, "vllm_flash_attn_version", None) for impl in impls}
    found.discard(None)
    only = found.pop() if len(found) == 1 else None
    return only if isinstance(only, int) and not isinstance(only, bool) else None


def read_vllm_snapshot(
    vllm_config: Any,
    static_forward_context: Mapping[str, Any],
    environ: Mapping[str, str],
    modules: Mapping[str, Any] | None = None,
) -> VllmSnapshot:
    """Read one warmed-up vLLM worker's attention from its ``vllm_config``, its attention layers, the
    model's modules by name (where the worker shows its model: the attention's output gate) and its
    environment."""
    requested, requested_source = requested_backend(vllm_config, environ)
    return VllmSnapshot(
        requested_backend=requested,
        requested_source=requested_source,
        layer_backends=layer_backends(static_forward_context),
        **_model_values(getattr(vllm_config, "model_config", None), static_forward_context, modules),
        **_engine_values(vllm_config, static_forward_context),
        batch_invariant=vllm_batch_invariant(environ),
    )
