"""The rollout contract ``check`` predicts where NeMo-RL generates with Megatron (core, stdlib only).

The same fields ``contract.megatron_inference`` records from the running engine, read from the
recipe (``preflight.megatron_generation``: the generation model's ``megatron_cfg`` as NeMo-RL
merges it, and ``mcore_generation_config``); what only the worker knows (the installed flash-attn
when no version is pinned, ``max_requests``, the versions) is pending.
"""

from __future__ import annotations

from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, configured_from
from nemo_rl_attn_align.contract.megatron_inference import ENGINE
from nemo_rl_attn_align.contract.semantics import megatron_inference_semantics
from nemo_rl_attn_align.preflight.megatron_generation import MegatronGenerationFacts
from nemo_rl_attn_align.vocab.kinds import dtype_or_none
from nemo_rl_attn_align.vocab.schema import Provenance


def predict_megatron_rollout(b: ContractBuilder, gen: MegatronGenerationFacts) -> AttentionContract:
    """The rollout contract megatron-core's inference engine would record, on ``b`` (which holds the
    identity fields both sides share)."""
    facts, key = gen.model, gen.model_key
    overrides = facts.model_overrides
    dtype = dtype_or_none(facts.precision)
    invariant = bool(overrides.get("batch_invariant_mode"))
    pinned = overrides.get("flash_attention_version")
    pinned = pinned if pinned in (2, 3, 4) else None
    megatron_inference_semantics(b, pinned, invariant, preview=True)
    if dtype is not None:
        b.configured("dtype", dtype, "policy.precision (the generation model's params dtype)")
        b.configured("kv_cache_dtype", dtype, "the KV buffer is allocated in the params dtype")
    b.configured("engine", ENGINE, "policy.generation.backend: megatron")
    if pinned:
        b.configured("flash_attention_version", pinned, f"{key}: model_overrides.flash_attention_version")
        b.configured("backend", f"flash_attn_{pinned}", "megatron-core calls flash-attn itself in decode and prefill")
    else:
        for name in ("flash_attention_version", "backend"):
            b.pending(name, "flash-attn 4 > 3 > 2, as installed in the worker (flash_attention_version unset)")
    configured_from(b, "kv_page_size", gen.block_size_tokens.value, gen.block_size_tokens.key)
    chunked = gen.enable_chunked_prefill.value
    if chunked is False:
        b.configured("chunked_prefill_chunk", None, f"{gen.enable_chunked_prefill.key}: false")
    else:
        configured_from(b, "chunked_prefill_chunk", gen.max_tokens.value, gen.max_tokens.key)
    if isinstance(chunked, bool):
        b.configured("mode", "chunked_prefill+decode" if chunked else "prefill+decode", gen.enable_chunked_prefill.key)
    configured_from(b, "prefix_caching", gen.enable_prefix_caching.value, gen.enable_prefix_caching.key)
    configured_from(b, "tp_size", facts.tensor_parallel_size.value, f"{key}: tensor_model_parallel_size")
    if dtype is not None:
        b.configured("rope_fusion", dtype in ("bf16", "fp16"), "NeMo-RL uses flashinfer's fused RoPE for fp16/bf16")
    b.configured("batch_invariant", invariant, f"{key}: model_overrides.batch_invariant_mode")
    b.configured(
        "deterministic", bool(overrides.get("deterministic_mode")), f"{key}: model_overrides.deterministic_mode"
    )
    b.pending("physical_batch", "max_requests follows from buffer_size_gb at engine start")
    b.pending("versions", "the worker's installed libraries")
    return b.build(unset=Provenance.PENDING, unset_source="known at runtime")
