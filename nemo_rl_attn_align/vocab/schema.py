"""The attention contract: one schema for the training side and the rollout side.

A contract lists what one worker's attention computes, field by field. Every field belongs to a
binding tier (``identity``, ``semantic``, ``recorded``; see ``binding.py``) and carries its value
together with *how it was known* (``Provenance``): read back from the running engine, taken from
the configuration, not observable at all, or (in a preview) not knowable before the run starts.

The schema is versioned (``CONTRACT_SCHEMA_VERSION``) and ``to_dict``/``from_dict`` round-trip
exactly through JSON. ``FIELDS`` is the documented field list; how each field's value is checked
(its kind) is in ``vocab.kinds``; the contract object itself (``AttentionContract``, its
``FieldValue``s and the ``ContractBuilder`` the hooks fill it with) is in ``contract.contract``.
Stdlib only: importing this module imports nothing heavy.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.vocab import behaviour, kinds
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from nemo_rl_attn_align.vocab.kinds import ContractError

# part of the schema's API: the engines' readers (contract/training.py, rollout.py, preview.py,
# megatron_inference.py) and config/settings.py import it from here
from nemo_rl_attn_align.vocab.kinds import normalize_dtype as normalize_dtype
from nemo_rl_attn_align.vocab.suggest import did_you_mean

#: Version of the contract schema; ``from_dict`` reads the earlier ones, whose records lack the
#: fields added since (``FIELDS_ADDED``: read as unobservable, not recorded then), and rejects any other.
CONTRACT_SCHEMA_VERSION = 4
FIELDS_SINCE_2 = ("attention_layers", "head_dim_v", "softmax_type", "mla", "attention_output_gate")
#: The fields each schema version added.
FIELDS_ADDED = {2: FIELDS_SINCE_2, 3: ("gpu",), 4: BEHAVIOUR_FIELDS}

#: The two sides a contract can describe.
SIDES = ("training", "rollout")


class NotBound(str):
    """Why a run has no record of a side whose workers do run (a generation backend the plugin has no
    hook for): the report says ``REPORT_ROLLOUT_NOT_BOUND``, not "absent by design"."""


class Provenance(str, enum.Enum):
    """How a field's value was known.

    * ``observed``: read back from the running engine after it started.
    * ``configured``: what the configuration asked for (or a rule derived from it); not read back.
    * ``unobservable``: the engine offers no readback; the value, if any, is what was requested and
      is never claimed as applied.
    * ``pending``: not knowable before the run starts (``check`` previews only); the hooks fill it.
    """

    OBSERVED = "observed"
    CONFIGURED = "configured"
    UNOBSERVABLE = "unobservable"
    PENDING = "pending"

    @property
    def known(self) -> bool:
        """True when the value may take part in a comparison (observed or configured)."""
        return self in (Provenance.OBSERVED, Provenance.CONFIGURED)


class Tier(str, enum.Enum):
    """Binding tier of a field: identity must be equal, semantic must also meet the mandate,
    recorded differences are listed and never rejected."""

    IDENTITY = "identity"
    SEMANTIC = "semantic"
    RECORDED = "recorded"


# --- the field list ----------------------------------------------------------------------------

MERGE_RULES = ("online_softmax_lse", "full_softmax")
REDUCTION_ORDERS = ("kv_index", "ring_step", "split_kv", "unspecified")
DOWNCASTS = ("final_write", "per_partial")
MODES = ("prefill", "prefill+decode", "chunked_prefill+decode")
#: ``TransformerConfig.softmax_type`` values (a vLLM layer with sinks runs ``learnable``).
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


@dataclass(frozen=True)
class FieldSpec:
    """One contract field: its tier, how its value is checked, whether ``None`` is a value, and docs.

    ``explained_by`` names the behaviour field (``vocab.behaviour``) that measures what this
    configuration field describes: where that one is known on both sides, this one explains it."""

    name: str
    tier: Tier
    check: Callable[[Any, str], Any]
    nullable: bool
    doc: str
    fix: str = ""
    explained_by: str | None = None

    def validate(self, value: Any) -> Any:
        """The canonical form of ``value`` for this field, or ``ContractError``."""
        if value is None:
            if self.nullable:
                return None
            raise ContractError(f"field {self.name}: null is not a value of this field")
        return self.check(value, f"field {self.name}")


def _spec(name, tier, check, doc, *, nullable=False, fix=None, explained_by=None):
    """A ``FieldSpec``; an identity field's fix, unless given, is ``_MODEL_FIX``."""
    fix = fix if fix is not None else _MODEL_FIX if tier is _ID else ""
    return FieldSpec(name, tier, check, nullable, doc, fix, explained_by)


_ID, _SEM, _REC = Tier.IDENTITY, Tier.SEMANTIC, Tier.RECORDED
_MODEL_FIX = "both sides must load the same model: check policy.model_name and policy.hf_config_overrides"

#: Every contract field, in the order reports list them.
FIELDS: tuple[FieldSpec, ...] = (
    # identity: the model fingerprint, the tokenizer and the logical batch
    _spec("architecture", _ID, kinds.text, "model class, e.g. Qwen2ForCausalLM (HF architectures[0])"),
    _spec("num_layers", _ID, kinds.positive_int, "number of transformer layers"),
    _spec("num_attention_heads", _ID, kinds.positive_int, "query heads (whole model, before TP split)"),
    _spec("num_query_groups", _ID, kinds.positive_int, "key/value heads (GQA groups)"),
    _spec(
        "head_dim",
        _ID,
        kinds.positive_int,
        "per-head query/key channels (Megatron kv_channels; under MLA qk_head_dim + qk_pos_emb_head_dim)",
    ),
    _spec(
        "head_dim_v",
        _ID,
        kinds.positive_int,
        "per-head value channels (head_dim, or MLA's v_head_dim)",
    ),
    _spec(
        "attention_layers",
        _ID,
        kinds.layer_indices,
        "indices of the layers with softmax attention, in order (a hybrid's attention layers only; the Mamba, "
        "gated delta-net and MLP layers between them run no softmax attention)",
    ),
    _spec(
        "softmax_type",
        _ID,
        kinds.choice(*SOFTMAX_TYPES),
        "the attention softmax: vanilla, or with a sink logit per head (learnable: gpt-oss's sinks; off-by-one: "
        "a fixed zero logit)",
        explained_by="softmax",
    ),
    _spec(
        "mla",
        _ID,
        kinds.mapping,
        "multi-latent attention: q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim "
        "(Megatron's names); null = none",
        nullable=True,
    ),
    _spec(
        "attention_output_gate",
        _ID,
        kinds.boolean,
        "the attention output is gated (Qwen3-Next / Qwen3.5: Megatron's attention_output_gate, vLLM's "
        "attn_output_gate)",
    ),
    # identity measured: what the live modules compute (vocab.behaviour), explained by the fields below
    _spec(
        "rope",
        _ID,
        behaviour.rope,
        "each attention layer's rotary embedding as its module computes it: the channel pairs it rotates, the angle "
        "at fixed positions, the magnitude",
        fix="the two engines rotate differently: see the difference and the rope_* fields",
    ),
    _spec(
        "mask",
        _ID,
        behaviour.mask,
        "the mask each attention layer's kernel is given: causal, and the keys before the query it sees (a query sees "
        "window + 1 tokens; null: all)",
        fix="the two kernels see different tokens: see the difference and the window fields",
    ),
    _spec(
        "softmax",
        _ID,
        behaviour.softmax,
        "the softmax as each attention layer's module holds it: scale, logit soft cap, sinks",
        fix="the two softmaxes differ: see the difference and the softmax_* fields",
    ),
    _spec(
        "softmax_scale",
        _ID,
        kinds.fp32,
        "the scale the kernel multiplies QK^T by, resolved (never a default), rounded to fp32 as kernels take it (TE, "
        "flash-attn: C float)",
        explained_by="softmax",
    ),
    _spec("causal", _ID, kinds.boolean, "causal mask", explained_by="mask"),
    _spec(
        "sliding_window",
        _ID,
        kinds.non_negative_int,
        "left window in tokens as the kernel receives it; null = full attention",
        nullable=True,
        explained_by="mask",
    ),
    _spec(
        "layer_windows",
        _ID,
        kinds.layer_windows,
        "per attention layer (attention_layers), in order: the left window the kernel receives (null = full "
        "attention); tells interleaved sliding/full layers apart",
        explained_by="mask",
    ),
    _spec(
        "logit_softcapping",
        _ID,
        kinds.positive_fp32,
        "attention logit soft cap c (logits -> c * tanh(logits / c)), as fp32; null = none",
        nullable=True,
        explained_by="softmax",
    ),
    _spec(
        "rope_type",
        _ID,
        kinds.text,
        "rotary embedding type: default, linear, dynamic, yarn, llama3, mrope, none",
        explained_by="rope",
    ),
    _spec(
        "rope_parameters",
        _ID,
        kinds.mapping,
        "rotary parameters: theta, scaling factors, partial rotary fraction",
        explained_by="rope",
    ),
    _spec(
        "vocab_size",
        _ID,
        kinds.positive_int,
        "logical (unpadded) vocabulary the logprobs are taken over",
    ),
    _spec(
        "tokenizer",
        _ID,
        kinds.text,
        "tokenizer that produced the token ids: sha256 of its files for a local directory (compared by content), else "
        "its name",
        fix="use one tokenizer on both sides (policy.tokenizer.name)",
    ),
    _spec(
        "batch_size",
        _ID,
        kinds.positive_int,
        "logical batch: sequences whose token logprobs are compared",
        fix="score the same batch on both sides",
    ),
    # semantic: what the reduction means; must agree with each other and with the mandate
    _spec(
        "merge_rule",
        _SEM,
        kinds.choice(*MERGE_RULES),
        "how partial results combine: online_softmax_lse (merge (out, lse) partials) or full_softmax (one softmax over "
        "the whole row)",
        fix="use a FlashAttention/FusedAttention-family backend on both sides (unfused and local compute one full "
        "softmax), or relax attention_align.mandate.merge_rule",
    ),
    _spec(
        "reduction_order",
        _SEM,
        kinds.choice(*REDUCTION_ORDERS),
        "order partials are folded: kv_index (by global KV block index, canonical), ring_step (TE CP ring), split_kv "
        "(split-KV combine), unspecified",
        fix="attention_align.preset: aligned (or check --fix) sets it: rollout VLLM_BATCH_INVARIANT=1 in "
        "policy.generation.vllm_cfg.env_vars (one KV split; Megatron generation: model_overrides."
        "batch_invariant_mode with flash_attention_version 3/4, check --fix); training "
        "context_parallel_size 1 (NeMo-RL packs "
        "sequences under CP and TE runs packed attention only over its p2p ring); or relax "
        "attention_align.mandate.reduction_order",
    ),
    _spec(
        "acc_dtype",
        _SEM,
        kinds.dtype,
        "dtype of the running (out, lse) accumulators",
        fix="use kernels that accumulate in the demanded dtype, or relax attention_align.mandate.acc_dtype",
    ),
    _spec(
        "downcast",
        _SEM,
        kinds.choice(*DOWNCASTS),
        "where the output leaves acc_dtype: final_write (once) or per_partial (each partial before the merge)",
        fix="per-partial downcasts come from TE context parallelism over a p2p ring (NeMo-RL's packed sequences "
        "run no other): use context_parallel_size 1, or relax attention_align.mandate.downcast",
    ),
    _spec(
        "dtype",
        _SEM,
        kinds.dtype,
        "dtype of Q/K/V and of the attention output",
        fix="set policy.precision and policy.generation.vllm_cfg.precision to the same dtype, or set "
        "attention_align.allow_dtype_difference: true for a deliberate sweep",
    ),
    # recorded: how it was materialized; every difference is listed, none rejected
    _spec("engine", _REC, kinds.text, "engine: megatron-te, megatron-local, vllm"),
    _spec(
        "backend",
        _REC,
        kinds.backend,
        "attention backend id (TE FlashAttention/FusedAttention/UnfusedDotProductAttention, vLLM "
        "FLASH_ATTN/FLASHINFER/...); a mapping layer -> backend when layers differ",
    ),
    _spec(
        "reduction_engine",
        _REC,
        kinds.text,
        "who merges partials: single_kernel, te_cp_p2p, te_cp_all_gather, te_cp_a2a, te_cp_a2a+p2p, fa_split_combine, "
        "...",
    ),
    _spec(
        "split_kv_policy",
        _REC,
        kinds.split_kv,
        "none, heuristic (kernel picks the split count), fixed_count:<n>, fixed_size:<tokens>",
    ),
    _spec(
        "kv_page_size",
        _REC,
        kinds.positive_int,
        "paged-KV block size in tokens; null when KV is not paged",
        nullable=True,
    ),
    _spec(
        "kv_cache_dtype",
        _REC,
        kinds.text,
        "KV-cache dtype (auto, fp8, ...); null when there is no KV cache",
        nullable=True,
    ),
    _spec(
        "chunked_prefill_chunk",
        _REC,
        kinds.positive_int,
        "chunked-prefill token budget per step; null when prefill is not chunked",
        nullable=True,
    ),
    _spec("prefix_caching", _REC, kinds.boolean, "KV prefix caching on; null when there is no KV cache", nullable=True),
    _spec("cp_size", _REC, kinds.positive_int, "context-parallel size"),
    _spec(
        "decode_cp_size",
        _REC,
        kinds.positive_int,
        "decode context-parallel size (vLLM decode_context_parallel_size); null when the engine does not decode",
        nullable=True,
    ),
    _spec(
        "cp_layout",
        _REC,
        kinds.choice("none", "load_balanced", "contiguous"),
        "sequence layout over CP ranks (load_balanced: rank r holds chunks r and 2cp-1-r)",
    ),
    _spec(
        "cp_comm_type",
        _REC,
        kinds.choice("p2p", "all_gather", "a2a", "a2a+p2p"),
        "CP communication; null when cp_size is 1",
        nullable=True,
    ),
    _spec("tp_size", _REC, kinds.positive_int, "tensor-parallel size"),
    _spec(
        "mode", _REC, kinds.choice(*MODES), "prefill (full-sequence forward), prefill+decode, chunked_prefill+decode"
    ),
    _spec(
        "rope_fusion", _REC, kinds.boolean, "fused RoPE kernel; null when the engine has no such switch", nullable=True
    ),
    _spec(
        "physical_batch",
        _REC,
        kinds.positive_int,
        "sequences per kernel launch (micro batch, max_num_seqs)",
        nullable=True,
    ),
    _spec(
        "batch_invariant",
        _REC,
        kinds.boolean,
        "batch-invariant mode (Megatron batch_invariant_mode, VLLM_BATCH_INVARIANT)",
        nullable=True,
    ),
    _spec(
        "deterministic",
        _REC,
        kinds.boolean,
        "deterministic mode (Megatron deterministic_mode); null when the engine has none",
        nullable=True,
    ),
    _spec(
        "flash_attention_version", _REC, kinds.positive_int, "flash-attn major version in use (2, 3, 4)", nullable=True
    ),
    _spec("gpu", _REC, kinds.text, "GPU generation (sm80, sm90, ...) from torch.cuda; null: none", nullable=True),
    _spec("versions", _REC, kinds.mapping, "library versions: torch, megatron.core, transformer_engine, vllm, ..."),
)

FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in FIELDS)
_SPECS: dict[str, FieldSpec] = {spec.name: spec for spec in FIELDS}


def field_spec(name: str) -> FieldSpec:
    """The spec of field ``name``; unknown names raise ``ContractError`` with a did-you-mean."""
    try:
        return _SPECS[name]
    except KeyError:
        close = did_you_mean(name, FIELD_NAMES)
        hint = f"; did you mean {close!r}?" if close else ""
        raise ContractError(f"unknown contract field {name!r}{hint}") from None


def fields_of(tier: Tier) -> tuple[str, ...]:
    """Names of the fields in ``tier``, in report order."""
    return tuple(spec.name for spec in FIELDS if spec.tier is tier)
