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

``megatron_snapshot.read_inference`` reads them from the objects the hook hands over (no host
import) into an ``InferenceSnapshot``; ``megatron_inference_contract`` maps it onto the contract fields.
"""

from __future__ import annotations

from collections.abc import Mapping

from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, put_field
from nemo_rl_attn_align.contract.megatron_snapshot import ContextSnapshot, InferenceSnapshot
from nemo_rl_attn_align.contract.semantics import megatron_inference_semantics
from nemo_rl_attn_align.contract.training import model_identity_fields
from nemo_rl_attn_align.preflight.megatron_generation_facts import resolve_flash_version
from nemo_rl_attn_align.vocab.kinds import dtype_or_none

#: The engine name both the record and the preview give Megatron generation.
ENGINE = "megatron-inference"
#: Distributions whose versions go into the record (flash-attn 2, 3 and 4 under their PyPI names).
VERSIONED = ("torch", "megatron-core", "flash-attn", "flash-attn-3", "flash-attn-4", "flashinfer-python", "nemo-rl")


def _kv_fields(b: ContractBuilder, ctx: ContextSnapshot) -> None:
    src = "DynamicInferenceContext."
    put_field(b, "kv_page_size", ctx.block_size_tokens, src + "block_size_tokens")
    put_field(b, "kv_cache_dtype", dtype_or_none(ctx.params_dtype), src + "params_dtype (the KV buffer's dtype)")
    chunked = ctx.enable_chunked_prefill
    if chunked is False:
        put_field(b, "chunked_prefill_chunk", None, src + "enable_chunked_prefill is false", "configured")
    else:
        put_field(b, "chunked_prefill_chunk", ctx.max_tokens, src + "max_tokens (the step's token budget)")
    if isinstance(chunked, bool):
        mode = "chunked_prefill+decode" if chunked else "prefill+decode"
        put_field(b, "mode", mode, src + "enable_chunked_prefill")
    else:
        b.unobservable("mode", None, src + "enable_chunked_prefill not read")
    put_field(b, "prefix_caching", ctx.enable_prefix_caching, src + "enable_prefix_caching")
    put_field(b, "rope_fusion", ctx.use_flashinfer_fused_rope, src + "use_flashinfer_fused_rope")
    put_field(b, "physical_batch", ctx.max_requests, src + "max_requests")


def megatron_inference_contract(
    snapshot: InferenceSnapshot, worker_id: str, versions: Mapping[str, str] | None = None
) -> AttentionContract:
    """The rollout contract of one Megatron generation worker; any snapshot (even
    ``InferenceSnapshot()``) gives a whole contract, unread fields unobservable with the reason."""
    b = ContractBuilder("rollout", worker_id)
    model, ctx = snapshot.model, snapshot.context
    src = f"{model.config_class}."
    model_identity_fields(b, model, src)
    version, why = resolve_flash_version(model.flash_attention_version, snapshot.flash_available)
    invariant = model.batch_invariant_mode
    megatron_inference_semantics(b, version, invariant if isinstance(invariant, bool) else None, preview=False)
    put_field(b, "dtype", dtype_or_none(model.params_dtype), src + "params_dtype")
    put_field(b, "engine", ENGINE, "megatron-core DynamicInferenceEngine (NeMo-RL's Megatron generation)", "configured")
    how = f"megatron-core Attention._resolve_flash_version: {why}"
    put_field(b, "flash_attention_version", version, how)
    put_field(
        b, "backend", f"flash_attn_{version}" if version else None, how + "; TE is not called in decode or prefill"
    )
    _kv_fields(b, ctx)
    put_field(b, "tp_size", model.tensor_model_parallel_size, src + "tensor_model_parallel_size")
    put_field(b, "batch_invariant", invariant, src + "batch_invariant_mode")
    put_field(b, "deterministic", model.deterministic_mode, src + "deterministic_mode")
    if versions:
        put_field(b, "versions", dict(versions), "importlib.metadata", "observed")
    return b.build(unset_source="not known to the Megatron generation worker")
