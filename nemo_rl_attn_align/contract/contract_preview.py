"""Predict both attention contracts from a resolved NeMo-RL config alone (``binding.binding_preview`` binds them).

The training contract comes from ``policy`` / ``policy.megatron_cfg``, the rollout contract from
``policy.generation.vllm_cfg`` / ``vllm_kwargs`` (where NeMo-RL generates with Megatron, from the
generation model's ``megatron_cfg`` and ``mcore_generation_config``). What the config fixes is
``configured``; what only the running engines know (the model's shape, read from its HF config at
start, vLLM's own defaults, library versions) is ``pending``, so the predicted binding is at best
``incomparable`` and fails only on differences the config already implies. ``worker_env``
predicts each side's worker environment (``env_vars`` over the driver's).

The behaviour fields (``rope``, ``mask``, ``softmax``) are ``configured`` where a side's host computed
them before launch (``check --training-python`` / ``--rollout-python``: ``RecipeFacts.behaviour``),
else pending until the workers measure them.

The semantic tier, and the recorded fields that follow from it, come from ``semantics``: the same
rules the workers record with. Facts behind each rule are written in the ``source`` of each field.
Every public function here takes the recipe read once (``preflight.recipe_facts.RecipeFacts``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from typing import Any

from nemo_rl_attn_align.contract.attention_identity import model_identity
from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, configured_from
from nemo_rl_attn_align.contract.rollout import kv_cache_format
from nemo_rl_attn_align.contract.rope import canonical_rope, hf_rope
from nemo_rl_attn_align.contract.semantics import megatron_inference_semantics, te_semantics, vllm_semantics
from nemo_rl_attn_align.model.model_config import HFModelConfig, text_config
from nemo_rl_attn_align.preflight.behaviour_facts import FLAGS
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.preflight.megatron_generation_facts import MegatronGenerationFacts
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from nemo_rl_attn_align.vocab.kinds import ContractError, dtype_or_none
from nemo_rl_attn_align.vocab.schema import (
    NotBound,
    Provenance,
    Tier,
    fields_of,
)

#: megatron_cfg.model_overrides keys that set an identity field on the training side only.
_MODEL_OVERRIDE_FIELDS = {
    "num_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_query_groups",
    "kv_channels": "head_dim",
    "softmax_scale": "softmax_scale",
}
#: Generation backends whose workers record a rollout contract (sglang, dynamo, trtllm do not).
BOUND_GENERATION_BACKENDS = ("vllm", "megatron")


def _identity(b: ContractBuilder, facts: RecipeFacts, side: str) -> None:
    """Fields both sides share: causal LM, the tokenizer, the logical batch, what the model's local
    ``config.json`` fixes (both sides build the model from it) and the attention layers as this
    side's host builds them from it (``RecipeFacts.model``); the rest pending."""
    for name in fields_of(Tier.IDENTITY):
        b.pending(name, "read from the HF config of policy.model_name when the worker starts")
    model = facts.model
    if model.config is not None:
        source = f"{model.config.path} (the config.json both sides load)"
        for name, value in identity_fields(model.config.config).items():
            if value is None:  # logit_softcapping: null is none, a value like any other
                b.configured(name, None, source)
            else:
                configured_from(b, name, value, source)
    model_identity(b, model.side(side), "configured")
    b.configured("causal", True, "decoder-only LM: causal mask")
    files = facts.files
    if isinstance(files.tokenizer_name, str) and files.tokenizer_name:
        tokenizer = files.tokenizer  # the workers' rule: local files by content
        if tokenizer.identity is None:
            b.pending("tokenizer", f"policy.tokenizer.name: {tokenizer.how}")
        else:
            b.configured(
                "tokenizer",
                tokenizer.identity,
                f"policy.tokenizer.name: {tokenizer.how} (NeMo-RL tokenizes once and feeds token ids to both sides)",
            )
    else:
        b.pending("tokenizer", "policy.tokenizer.name is not set")
    if facts.rollout_batch_size:
        b.configured(
            "batch_size", facts.rollout_batch_size, "grpo.num_prompts_per_step x grpo.num_generations_per_prompt"
        )
    else:
        b.pending("batch_size", "known when the first rollout batch is scored")


def _behaviour(b: ContractBuilder, facts: RecipeFacts, side: str, flag: str | None) -> None:
    """``rope``, ``mask`` and ``softmax``: configured where this side's host computed them before launch
    (``RecipeFacts.behaviour``: the model NeMo-RL's worker would build, read by the worker's own
    reader), so the preview binds them as the run binds its records; else pending (``flag``: the
    ``check`` option that computes them)."""
    computed = facts.behaviour_of(side)
    for name in BEHAVIOUR_FIELDS:
        if computed is None:
            how = f"; check {flag} PY computes it before launch" if flag else ""
            b.pending(name, f"measured from the worker's attention modules when it starts{how}")
            continue
        found = computed.computed(name)
        if isinstance(found, str):
            b.pending(name, f"not computed by {computed.host or computed.python}: {found}")
            continue
        value, how = found
        where = facts.model.config.path if facts.model.config is not None else "config.json"
        try:
            b.configured(name, value, f"computed by {computed.host} here, from {where}: {how}")
        except ContractError as err:
            b.pending(name, f"{computed.host} computed a value the contract cannot hold: {err}")


def absent_sides(facts: RecipeFacts) -> dict[str, str]:
    """The sides a config has no contract for, each with the reason (``training`` before ``rollout``):
    the Megatron hook records training only where NeMo-RL enables Megatron (a truthy
    ``policy.megatron_cfg.enabled``); rollout is recorded only with ``policy.generation.backend``
    vllm or megatron (``BOUND_GENERATION_BACKENDS``)."""
    absent = {}
    if not facts.megatron_enabled:
        absent["training"] = "policy.megatron_cfg.enabled is not truthy (the contract covers Megatron training)"
    backend = facts.generation.backend
    if backend is None:
        absent["rollout"] = "policy.generation.backend is not set (no generation workers to bind)"
    elif backend not in BOUND_GENERATION_BACKENDS:
        absent["rollout"] = NotBound(
            f"policy.generation.backend {backend!r}: its workers record nothing "
            "(the plugin hooks vLLM and Megatron generation only)"
        )
    return absent


def predict_training(recipe: RecipeFacts) -> AttentionContract | None:
    """The training contract a Megatron policy worker would record, or ``None`` when
    ``policy.megatron_cfg.enabled`` is not truthy."""
    facts = recipe.require_policy()
    if "training" in absent_sides(recipe):
        return None
    overrides = facts.model_overrides
    b = ContractBuilder("training", "preview-training")
    _identity(b, recipe, "training")
    _behaviour(b, recipe, "training", FLAGS["training"])
    for key, name in _MODEL_OVERRIDE_FIELDS.items():
        if key in overrides:
            configured_from(b, name, overrides[key], f"policy.megatron_cfg.model_overrides.{key} (training side only)")
    cp = facts.context_parallel_size
    comm = overrides.get("cp_comm_type") or "p2p"
    comm = comm if isinstance(comm, str) else "p2p"
    backend = facts.effective_backend
    te_semantics(b, backend, dtype_or_none(facts.precision), cp, comm, preview=True)
    impl = facts.transformer_impl
    b.configured(
        "engine",
        "megatron-te" if impl == "transformer_engine" else f"megatron-{impl}",
        "policy.megatron_cfg.transformer_impl",
    )
    if backend is not None:
        b.configured(
            "backend",
            f"AttnBackend.{backend}",
            "policy.megatron_cfg.attention_backend; TE's actual choice is observed at the first forward",
        )
    else:
        b.pending("backend", "attention_backend is invalid")
    configured_from(b, "cp_size", cp, "policy.megatron_cfg.context_parallel_size")
    b.configured(
        "cp_layout",
        "load_balanced" if cp > 1 else "none",
        "Megatron's causal CP layout: rank r holds chunks r and 2cp-1-r",
    )
    if cp > 1:  # an unknown value is the pre-flight rules' CONFIG_VALUE_INVALID; the field is then pending
        configured_from(b, "cp_comm_type", comm, "model_overrides.cp_comm_type (Megatron's default p2p)")
    else:
        b.configured("cp_comm_type", None, "no context parallelism")
    configured_from(b, "tp_size", facts.tensor_parallel_size.value, facts.tensor_parallel_size.key)
    b.configured("mode", "prefill", "logprobs come from a full-sequence forward")
    b.configured(
        "rope_fusion", facts.apply_rope_fusion, "policy.megatron_cfg.apply_rope_fusion (NeMo-RL's default true)"
    )
    configured_from(b, "physical_batch", facts.physical_batch.value, facts.physical_batch.key)
    # Megatron reads both flags by truthiness (``if config.batch_invariant_mode:``).
    b.configured("batch_invariant", bool(overrides.get("batch_invariant_mode")), "model_overrides.batch_invariant_mode")
    b.configured("deterministic", bool(overrides.get("deterministic_mode")), "model_overrides.deterministic_mode")
    b.pending("flash_attention_version", "the installed flash-attn, known at start")
    b.pending("versions", "the worker's installed libraries")
    return b.build(unset=Provenance.PENDING, unset_source="known at runtime")


def worker_env(facts: RecipeFacts, side: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A ``side``'s worker environment before its framework runs: the driver's, then that side's
    ``env_vars`` (NeMo-RL gives env_vars precedence over the driver's environment)."""
    if side == "rollout" and facts.megatron_generation is None:
        extra = facts.generation.env_vars
    else:
        extra = facts.policy.env_vars if facts.policy is not None else {}
    return {**environ, **extra}


def _vllm_kv_cache_dtype(b: ContractBuilder, gen: Any, model: HFModelConfig | None) -> None:
    """The KV-cache format the vLLM worker will record, by the record's rule (``rollout.kv_cache_format``):
    ``auto`` is the model dtype (``vllm_cfg.precision``), ``fp8`` is ``fp8_e4m3``; pending where the
    engine decides (``auto`` with a checkpoint whose ``quantization_config`` may choose an fp8 cache)."""
    requested, key = gen.kv_cache_dtype.value, gen.kv_cache_dtype.key
    if requested == "auto" and model is not None and model.config.get("quantization_config"):
        b.pending("kv_cache_dtype", f"{key} auto: {model.path}'s quantization_config may choose it at engine start")
        return
    value, how = kv_cache_format(requested, gen.precision.value)
    if value is None:
        b.pending("kv_cache_dtype", f"{key}={requested!r}: {how}")
        return
    via = f", {gen.precision.key}" if requested == "auto" else ""
    configured_from(b, "kv_cache_dtype", value, f"{key} {requested} ({how}{via})")


def _vllm_backends(
    b: ContractBuilder, forced: Any, env: Mapping[str, str], predicted: Collection[str] | None
) -> tuple[str, ...] | None:
    """Set ``backend``: the one forced, else the ones vLLM's selector is predicted to pick, else pending;
    returns them (None: vLLM's choice is not known)."""
    # A predicted backend comes from vLLM >= 0.25's selector, which never reads VLLM_ATTENTION_BACKEND.
    backend = forced or (None if predicted else env.get("VLLM_ATTENTION_BACKEND"))
    if isinstance(backend, str) and backend:
        configured_from(
            b, "backend", backend, "vllm_kwargs.attention_backend (VLLM_ATTENTION_BACKEND before vLLM 0.15)"
        )
        return (backend,)
    if not predicted:
        b.pending("backend", "vLLM selects a backend per layer at engine start")
        return None
    backends = tuple(sorted(set(predicted)))
    if len(backends) == 1:
        b.configured("backend", backends[0], "vLLM's selector on the GPU check --gpu predicts for")
    else:
        b.pending("backend", f"vLLM's selector picks {', '.join(backends)} for different layer kinds")
    return backends


def _megatron_rollout(b: ContractBuilder, gen: MegatronGenerationFacts) -> None:
    """The rollout fields megatron-core's inference engine would record (``contract.megatron_generation_contract``),
    read from the generation model's ``megatron_cfg`` as NeMo-RL merges it and ``mcore_generation_config``
    (``preflight.megatron_generation_facts``); what only the worker knows (the installed flash-attn when no
    version is pinned, ``max_requests``, the versions) is pending."""
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
    from nemo_rl_attn_align.contract.megatron_generation_contract import ENGINE  # megatron-core's inference: only here

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


def predict_rollout(
    recipe: RecipeFacts,
    environ: Mapping[str, str] | None = None,
    predicted_backends: Collection[str] | None = None,
) -> AttentionContract | None:
    """The rollout contract a vLLM (or Megatron) generation worker would record, or ``None`` when
    ``policy.generation.backend`` is neither. ``predicted_backends``: what vLLM's selector picks for
    the attention layers on the GPU ``check --gpu`` predicts for (None: no prediction; vLLM's
    choice is assumed)."""
    if "rollout" in absent_sides(recipe):
        return None
    b = ContractBuilder("rollout", "preview-rollout")
    if recipe.megatron_generation is not None:
        _identity(b, recipe, "training")  # the policy's own Megatron model generates
        _behaviour(b, recipe, "rollout", None)
        _megatron_rollout(b, recipe.megatron_generation)
    else:
        gen = recipe.generation
        env = worker_env(recipe, "rollout", os.environ if environ is None else environ)
        invariant = vllm_batch_invariant(env)
        _identity(b, recipe, "rollout")
        _behaviour(b, recipe, "rollout", FLAGS["rollout"])
        dtype = dtype_or_none(gen.precision.value)
        if dtype is not None:
            b.configured("dtype", dtype, gen.precision.key)
        vllm_semantics(b, _vllm_backends(b, gen.attention_backend, env, predicted_backends), invariant, preview=True)
        b.configured("engine", "vllm", "policy.generation.backend")
        configured_from(b, "kv_page_size", gen.block_size, "vllm_kwargs.block_size")
        _vllm_kv_cache_dtype(b, gen, recipe.model.config)
        chunked = gen.enable_chunked_prefill
        if chunked is False:
            b.configured("chunked_prefill_chunk", None, "vllm_kwargs.enable_chunked_prefill: false")
        else:
            configured_from(
                b, "chunked_prefill_chunk", gen.max_num_batched_tokens, "vllm_kwargs.max_num_batched_tokens"
            )
        b.configured(
            "mode",
            "prefill+decode" if chunked is False else "chunked_prefill+decode",
            "vllm_kwargs.enable_chunked_prefill (vLLM V1 default on)",
        )
        caching = gen.enable_prefix_caching
        if isinstance(caching.value, bool):
            b.configured("prefix_caching", caching.value, caching.key)
        else:
            b.pending("prefix_caching", "NeMo-RL turns it on for sm80+ GPUs at engine start")
        b.configured("cp_size", 1, "vLLM runs no context parallelism here")
        b.configured("cp_layout", "none", "no context parallelism")
        b.configured("cp_comm_type", None, "no context parallelism")
        configured_from(b, "tp_size", gen.tensor_parallel_size.value, gen.tensor_parallel_size.key)
        b.configured("rope_fusion", None, "vLLM applies RoPE in its own kernel; no switch")
        configured_from(b, "physical_batch", gen.max_num_seqs, "vllm_kwargs.max_num_seqs")
        b.configured("batch_invariant", invariant, "VLLM_BATCH_INVARIANT in the worker environment")
        b.configured("deterministic", None, "vLLM has no deterministic mode apart from batch invariance")
        b.pending("flash_attention_version", "vLLM's bundled flash-attn, known at start")
    b.pending("versions", "the worker's installed libraries")
    return b.build(unset=Provenance.PENDING, unset_source="known at runtime")


# The identity a model's ``config.json`` (``model.model_config``) fixes for both sides alike: both
# sides build the model from it; what their attention layers become is each host's reading.
def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def identity_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The identity fields a config.json fixes for both sides alike, beyond the attention layers
    (``contract.attention_identity`` reads those from each host's build): the architecture, the
    vocabulary, RoPE, soft capping and the softmax scale (fields it does not fix are left out).

    ``softmax_scale`` is ``query_pre_attn_scalar ** -0.5`` where the model has one (Gemma 2/3),
    else ``head_dim ** -0.5`` (not under multi-latent attention, whose scale YaRN's mscale sets in
    the engines); ``logit_softcapping`` is ``attn_logit_softcapping`` (None: none).
    """
    hf = text_config(hf)
    heads = _positive_int(hf.get("num_attention_heads"))
    out: dict[str, Any] = {}
    architectures = hf.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        out["architecture"] = architectures[0]
    if _positive_int(hf.get("vocab_size")):
        out["vocab_size"] = hf["vocab_size"]
    hidden = _positive_int(hf.get("hidden_size"))
    head_dim = _positive_int(hf.get("head_dim")) or (hidden // heads if hidden and heads else None)
    if head_dim and hf.get("kv_lora_rank") is None:
        scalar = hf.get("query_pre_attn_scalar")
        base = scalar if isinstance(scalar, (int, float)) and not isinstance(scalar, bool) and scalar > 0 else head_dim
        out["softmax_scale"] = 1.0 / math.sqrt(base)
    cap = hf.get("attn_logit_softcapping")
    out["logit_softcapping"] = (
        float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    )
    rope = hf_rope(hf)
    out["rope_type"], out["rope_parameters"] = canonical_rope(
        rope["rope_theta"], rope["partial_rotary_factor"], rope["rope_scaling"]
    )
    return out
