"""The rollout side when NeMo-RL generates with Megatron (``policy.generation.backend: megatron``).

The policy worker generates with megatron-core's dynamic inference engine
(``nemo_rl/models/generation/megatron/megatron_worker.py``, ``MegatronGenerationMixin``): a
``DynamicInferenceContext`` over the generation model (the training model, or a dedicated
inference-layout model with ``mcore_generation_config`` merged over ``megatron_cfg``). What its
attention runs, read at megatron-core 0.19.2 (``transformer/attention.py``,
``inference/contexts/dynamic_context.py``):

* every attention layer calls flash-attn itself (``Attention.flash_decode_and_prefill``), not
  Transformer Engine, whatever ``attention_backend`` says: FlashAttention-4 if installed, else 3,
  else 2, or the generation ``flash_attention_version`` pins (``_resolve_flash_version``);
* decode and prefill read a paged KV cache of ``block_size_tokens`` tokens a block, held in the
  model's ``params_dtype``; chunked prefill cuts prompts to the ``max_tokens`` step budget;
* ``num_splits=0`` (flash-attn's split-KV heuristic), 1 under ``batch_invariant_mode``;
* no context parallelism (NeMo-RL pins the inference CP to 1); RoPE by flashinfer's fused kernel
  when the params dtype is half (``use_flashinfer_fused_rope``).

``inference_facts`` reads those facts with ``getattr`` from the objects the hook hands over (no host
import); ``megatron_inference_contract`` maps them onto the contract fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, put_field
from nemo_rl_attn_align.contract.kinds import dtype_or_none
from nemo_rl_attn_align.contract.semantics import megatron_inference_semantics
from nemo_rl_attn_align.contract.training import model_config_facts, model_identity_fields, recorded_attributes

#: The engine name both the record and the preview give Megatron generation.
ENGINE = "megatron-inference"
#: ``DynamicInferenceContext`` attributes recorded as they are (set from its ``InferenceConfig``).
CONTEXT_FIELDS = (
    "block_size_tokens",
    "max_tokens",
    "max_requests",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "use_flashinfer_fused_rope",
    "params_dtype",
    "kv_cache_management_mode",
    "is_hybrid_model",
)
#: Distributions whose versions go into the record (flash-attn 2, 3 and 4 under their PyPI names).
VERSIONED = ("torch", "megatron-core", "flash-attn", "flash-attn-3", "flash-attn-4", "flashinfer-python", "nemo-rl")


def resolve_flash_version(pinned: Any, available: Mapping[str, bool | None]) -> tuple[int | None, str]:
    """The flash-attn generation the dynamic-batching attention calls, as megatron-core's
    ``Attention._resolve_flash_version`` decides it (the pinned one, else 4 > 3 > 2 as installed),
    and why; None when none is installed or what is installed is not known."""
    if pinned in (2, 3, 4):
        return int(pinned), f"flash_attention_version={pinned} (pinned)"
    fa4, fa3, fa2 = (available.get(key) for key in ("fa4", "fa3", "fa2"))
    if fa4:
        return 4, "flash_attention_version unset: FlashAttention-4 is installed (HAVE_FA4)"
    if fa3:
        return 3, "flash_attention_version unset: FlashAttention-3 is installed (HAVE_FA3), 4 is not"
    if fa2:
        return 2, "flash_attention_version unset: only flash-attn 2 is installed"
    if None in (fa4, fa3, fa2):
        return None, "megatron-core's attention module was not read"
    return (
        None,
        "no flash-attn is installed: megatron-core's dynamic batching asserts flash-attn >= 2.7.3 at the first step",
    )


def inference_facts(
    model_cfg: Any,
    context: Any,
    flash_available: Mapping[str, bool | None],
    policy_cfg: Mapping[str, Any] | None = None,
    colocated: bool | None = None,
) -> dict[str, Any]:
    """JSON-ready facts of one generation worker: the generation model's config (as the training
    side records it), the inference context's settings and which flash-attn generations megatron-core
    found (``{"fa3": bool, "fa4": bool}``; None: not read)."""
    return {
        "model": model_config_facts(model_cfg, policy_cfg),
        "context": recorded_attributes(context, CONTEXT_FIELDS),
        "flash_available": dict(flash_available),
        "colocated": colocated,
    }


def _kv_fields(b: ContractBuilder, ctx: Mapping[str, Any]) -> None:
    src = "DynamicInferenceContext."
    put_field(b, "kv_page_size", ctx.get("block_size_tokens"), src + "block_size_tokens")
    put_field(b, "kv_cache_dtype", dtype_or_none(ctx.get("params_dtype")), src + "params_dtype (the KV buffer's dtype)")
    chunked = ctx.get("enable_chunked_prefill")
    if chunked is False:
        put_field(b, "chunked_prefill_chunk", None, src + "enable_chunked_prefill is false", "configured")
    else:
        put_field(b, "chunked_prefill_chunk", ctx.get("max_tokens"), src + "max_tokens (the step's token budget)")
    if isinstance(chunked, bool):
        mode = "chunked_prefill+decode" if chunked else "prefill+decode"
        put_field(b, "mode", mode, src + "enable_chunked_prefill")
    else:
        b.unobservable("mode", None, src + "enable_chunked_prefill not read")
    put_field(b, "prefix_caching", ctx.get("enable_prefix_caching"), src + "enable_prefix_caching")
    put_field(b, "rope_fusion", ctx.get("use_flashinfer_fused_rope"), src + "use_flashinfer_fused_rope")
    put_field(b, "physical_batch", ctx.get("max_requests"), src + "max_requests")


def megatron_inference_contract(
    facts: Mapping[str, Any], worker_id: str, versions: Mapping[str, str] | None = None
) -> AttentionContract:
    """The rollout contract of one Megatron generation worker from ``inference_facts``; any facts
    (even ``{}``) give a whole contract, unread fields unobservable with the reason."""
    b = ContractBuilder("rollout", worker_id)
    model, ctx = facts.get("model") or {}, facts.get("context") or {}
    src = f"{model.get('model_config_class', 'TransformerConfig')}."
    model_identity_fields(b, model, src)
    version, why = resolve_flash_version(model.get("flash_attention_version"), facts.get("flash_available") or {})
    invariant = model.get("batch_invariant_mode")
    megatron_inference_semantics(b, version, invariant if isinstance(invariant, bool) else None, preview=False)
    put_field(b, "dtype", dtype_or_none(model.get("params_dtype")), src + "params_dtype")
    put_field(b, "engine", ENGINE, "megatron-core DynamicInferenceEngine (NeMo-RL's Megatron generation)", "configured")
    how = f"megatron-core Attention._resolve_flash_version: {why}"
    put_field(b, "flash_attention_version", version, how)
    put_field(
        b, "backend", f"flash_attn_{version}" if version else None, how + "; TE is not called in decode or prefill"
    )
    _kv_fields(b, ctx)
    put_field(b, "cp_size", 1, "NeMo-RL pins the inference context parallelism to 1", "configured")
    put_field(b, "cp_layout", "none", "no context parallelism", "configured")
    put_field(b, "cp_comm_type", None, "no context parallelism", "configured")
    put_field(b, "decode_cp_size", None, "megatron-core's inference has no decode context parallelism", "configured")
    put_field(b, "tp_size", model.get("tensor_model_parallel_size"), src + "tensor_model_parallel_size")
    put_field(b, "batch_invariant", invariant, src + "batch_invariant_mode")
    put_field(b, "deterministic", model.get("deterministic_mode"), src + "deterministic_mode")
    if versions:
        put_field(b, "versions", dict(versions), "importlib.metadata", "observed")
    return b.build(unset_source="not known to the Megatron generation worker")
