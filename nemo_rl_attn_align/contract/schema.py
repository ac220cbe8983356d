"""The attention contract: one schema for the training side and the rollout side.

A contract lists what one worker's attention computes, field by field. Every field belongs to a
binding tier (``identity``, ``semantic``, ``recorded``; see ``binding.py``) and carries its value
together with *how it was known* (``Provenance``): read back from the running engine, taken from
the configuration, not observable at all, or (in a preview) not knowable before the run starts.

The schema is versioned (``CONTRACT_SCHEMA_VERSION``) and ``to_dict``/``from_dict`` round-trip
exactly through JSON. ``FIELDS`` is the documented field list; the contract object itself (``AttentionContract``, its
``FieldValue``s and the ``ContractBuilder`` the hooks fill it with) is in ``contract.contract``. Stdlib only:
importing this module imports nothing heavy.
"""

from __future__ import annotations

import enum
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.suggest import did_you_mean

#: Version of the contract schema; ``from_dict`` rejects any other.
CONTRACT_SCHEMA_VERSION = 1

#: The two sides a contract can describe.
SIDES = ("training", "rollout")


class ContractError(ValueError):
    """A contract (or one of its fields) that does not fit the schema; the message names the field."""


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


# --- value kinds -------------------------------------------------------------------------------

_DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "torch.float8_e4m3fn": "fp8",
}

#: Canonical dtype spellings used by every dtype field.
DTYPES = ("fp32", "bf16", "fp16", "fp8")


def normalize_dtype(value: Any) -> str:
    """Canonical short dtype name for a torch dtype, a torch spelling or a short spelling.

    ``torch.bfloat16``, ``"bfloat16"`` and ``"bf16"`` all give ``"bf16"``; anything else raises
    ``ContractError``.
    """
    key = str(value).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ContractError(f"unknown dtype {value!r}; use one of {', '.join(DTYPES)} (torch spellings are accepted)")
    return _DTYPE_ALIASES[key]


def _check_json(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (tuples become lists); rejects NaN/inf and non-string keys."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContractError(f"{where}: {value!r} is not a finite number (JSON cannot carry it)")
        return value
    if isinstance(value, (list, tuple)):
        return [_check_json(item, where) for item in value]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ContractError(f"{where}: mapping key {key!r} is not a string")
            out[key] = _check_json(item, where)
        return out
    raise ContractError(f"{where}: {type(value).__name__} value {value!r} is not JSON data")


def _kind_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}: expected an integer, got {value!r}")
    return value


def _kind_non_negative_int(value: Any, where: str) -> int:
    value = _kind_int(value, where)
    if value < 0:
        raise ContractError(f"{where}: expected an integer >= 0, got {value!r}")
    return value


def _kind_positive_int(value: Any, where: str) -> int:
    value = _kind_int(value, where)
    if value < 1:
        raise ContractError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _kind_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"{where}: expected a number, got {value!r}")
    return _check_json(float(value), where)


def _kind_fp32(value: Any, where: str) -> float:
    """A number as the fp32 a kernel receives it (C ``float``), kept as the exactly representable double."""
    number = _kind_float(value, where)
    try:
        rounded = struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        rounded = math.inf
    if math.isinf(rounded):
        raise ContractError(f"{where}: {value!r} does not fit a 32-bit float")
    return rounded


def _kind_positive_fp32(value: Any, where: str) -> float:
    number = _kind_fp32(value, where)
    if number <= 0:
        raise ContractError(f"{where}: expected a number > 0, got {value!r}")
    return number


def _kind_layer_windows(value: Any, where: str) -> list:
    """One left window (int >= 0) or null (full attention) per layer, in layer order."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ContractError(
            f"{where}: expected a non-empty list of per-layer windows (int >= 0 or null), got {value!r}"
        )
    return [None if item is None else _kind_non_negative_int(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _kind_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{where}: expected true or false, got {value!r}")
    return value


def _kind_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ContractError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _kind_dtype(value: Any, where: str) -> str:
    try:
        return normalize_dtype(value)
    except ContractError as err:
        raise ContractError(f"{where}: {err}") from None


def _kind_mapping(value: Any, where: str) -> dict:
    if not isinstance(value, Mapping):
        raise ContractError(f"{where}: expected a mapping, got {value!r}")
    return _check_json(value, where)


def _kind_backend(value: Any, where: str) -> Any:
    """One backend name, or a mapping layer -> backend name when layers differ."""
    if isinstance(value, Mapping):
        return {key: _kind_str(item, f"{where}[{key!r}]") for key, item in _kind_mapping(value, where).items()}
    return _kind_str(value, where)


_SPLIT_KV_RE = re.compile(r"^(none|heuristic|fixed_count:[1-9][0-9]*|fixed_size:[1-9][0-9]*)$")


def _kind_split_kv(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SPLIT_KV_RE.match(value):
        raise ContractError(f"{where}: expected none, heuristic, fixed_count:<n> or fixed_size:<tokens>, got {value!r}")
    return value


def _choice(*choices: str) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if value not in choices:
            close = did_you_mean(value, choices) if isinstance(value, str) else None
            hint = f" (did you mean {close!r}?)" if close else ""
            raise ContractError(f"{where}: {value!r} is not one of {', '.join(choices)}{hint}")
        return value

    return check


# --- the field list ----------------------------------------------------------------------------

MERGE_RULES = ("online_softmax_lse", "full_softmax")
REDUCTION_ORDERS = ("kv_index", "ring_step", "split_kv", "unspecified")
DOWNCASTS = ("final_write", "per_partial")
MODES = ("prefill", "prefill+decode", "chunked_prefill+decode")


@dataclass(frozen=True)
class FieldSpec:
    """One contract field: its tier, how its value is checked, whether ``None`` is a value, and docs."""

    name: str
    tier: Tier
    check: Callable[[Any, str], Any]
    nullable: bool
    doc: str
    fix: str = ""

    def validate(self, value: Any) -> Any:
        """The canonical form of ``value`` for this field, or ``ContractError``."""
        if value is None:
            if self.nullable:
                return None
            raise ContractError(f"field {self.name}: null is not a value of this field")
        return self.check(value, f"field {self.name}")


def _spec(name, tier, check, doc, *, nullable=False, fix=""):
    return FieldSpec(name, tier, check, nullable, doc, fix)


_ID, _SEM, _REC = Tier.IDENTITY, Tier.SEMANTIC, Tier.RECORDED
_MODEL_FIX = "both sides must load the same model: check policy.model_name and policy.hf_config_overrides"

#: Every contract field, in the order reports list them.
FIELDS: tuple[FieldSpec, ...] = (
    # identity: the model fingerprint, the tokenizer and the logical batch
    _spec("architecture", _ID, _kind_str, "model class, e.g. Qwen2ForCausalLM (HF architectures[0])", fix=_MODEL_FIX),
    _spec("num_layers", _ID, _kind_positive_int, "number of transformer layers", fix=_MODEL_FIX),
    _spec("num_attention_heads", _ID, _kind_positive_int, "query heads (whole model, before TP split)", fix=_MODEL_FIX),
    _spec("num_query_groups", _ID, _kind_positive_int, "key/value heads (GQA groups)", fix=_MODEL_FIX),
    _spec("head_dim", _ID, _kind_positive_int, "per-head channels (Megatron kv_channels)", fix=_MODEL_FIX),
    _spec(
        "softmax_scale",
        _ID,
        _kind_fp32,
        "the scale the kernel multiplies QK^T by, resolved (never a default), rounded to fp32 as kernels take it (TE, "
        "flash-attn: C float)",
        fix=_MODEL_FIX,
    ),
    _spec("causal", _ID, _kind_bool, "causal mask", fix=_MODEL_FIX),
    _spec(
        "sliding_window",
        _ID,
        _kind_non_negative_int,
        "left window in tokens as the kernel receives it; null = full attention",
        nullable=True,
        fix=_MODEL_FIX,
    ),
    _spec(
        "layer_windows",
        _ID,
        _kind_layer_windows,
        "per layer, in order: the left window the kernel receives (null = full attention); tells interleaved "
        "sliding/full layers apart",
        fix=_MODEL_FIX,
    ),
    _spec(
        "logit_softcapping",
        _ID,
        _kind_positive_fp32,
        "attention logit soft cap c (logits -> c * tanh(logits / c)), as fp32; null = none",
        nullable=True,
        fix=_MODEL_FIX,
    ),
    _spec(
        "rope_type",
        _ID,
        _kind_str,
        "rotary embedding type: default, linear, dynamic, yarn, llama3, mrope, none",
        fix=_MODEL_FIX,
    ),
    _spec(
        "rope_parameters",
        _ID,
        _kind_mapping,
        "rotary parameters: theta, scaling factors, partial rotary fraction",
        fix=_MODEL_FIX,
    ),
    _spec(
        "vocab_size",
        _ID,
        _kind_positive_int,
        "logical (unpadded) vocabulary the logprobs are taken over",
        fix=_MODEL_FIX,
    ),
    _spec(
        "tokenizer",
        _ID,
        _kind_str,
        "tokenizer that produced the token ids: sha256 of its files for a local directory (compared by content), else "
        "its name",
        fix="use one tokenizer on both sides (policy.tokenizer.name)",
    ),
    _spec(
        "batch_size",
        _ID,
        _kind_positive_int,
        "logical batch: sequences whose token logprobs are compared",
        fix="score the same batch on both sides",
    ),
    # semantic: what the reduction means; must agree with each other and with the mandate
    _spec(
        "merge_rule",
        _SEM,
        _choice(*MERGE_RULES),
        "how partial results combine: online_softmax_lse (merge (out, lse) partials) or full_softmax (one softmax over "
        "the whole row)",
        fix="use a FlashAttention/FusedAttention-family backend on both sides (unfused and local compute one full "
        "softmax), or relax attention_align.mandate.merge_rule",
    ),
    _spec(
        "reduction_order",
        _SEM,
        _choice(*REDUCTION_ORDERS),
        "order partials are folded: kv_index (by global KV block index, canonical), ring_step (TE CP ring), split_kv "
        "(split-KV combine), unspecified",
        fix="attention_align.preset: aligned (or check --fix) sets it: rollout VLLM_BATCH_INVARIANT=1 in "
        "policy.generation.vllm_cfg.env_vars (one KV split); training context_parallel_size 1 (NeMo-RL packs "
        "sequences under CP and TE runs packed attention only over its p2p ring); or relax "
        "attention_align.mandate.reduction_order",
    ),
    _spec(
        "acc_dtype",
        _SEM,
        _kind_dtype,
        "dtype of the running (out, lse) accumulators",
        fix="use kernels that accumulate in the demanded dtype, or relax attention_align.mandate.acc_dtype",
    ),
    _spec(
        "downcast",
        _SEM,
        _choice(*DOWNCASTS),
        "where the output leaves acc_dtype: final_write (once) or per_partial (each partial before the merge)",
        fix="per-partial downcasts come from TE context parallelism over a p2p ring (NeMo-RL's packed sequences "
        "run no other): use context_parallel_size 1, or relax attention_align.mandate.downcast",
    ),
    _spec(
        "dtype",
        _SEM,
        _kind_dtype,
        "dtype of Q/K/V and of the attention output",
        fix="set policy.precision and policy.generation.vllm_cfg.precision to the same dtype, or set "
        "attention_align.allow_dtype_difference: true for a deliberate sweep",
    ),
    # recorded: how it was materialized; every difference is listed, none rejected
    _spec("engine", _REC, _kind_str, "engine: megatron-te, megatron-local, vllm"),
    _spec(
        "backend",
        _REC,
        _kind_backend,
        "attention backend id (TE FlashAttention/FusedAttention/UnfusedDotProductAttention, vLLM "
        "FLASH_ATTN/FLASHINFER/...); a mapping layer -> backend when layers differ",
    ),
    _spec(
        "reduction_engine",
        _REC,
        _kind_str,
        "who merges partials: single_kernel, te_cp_p2p, te_cp_all_gather, te_cp_a2a, te_cp_a2a+p2p, fa_split_combine, "
        "...",
    ),
    _spec(
        "split_kv_policy",
        _REC,
        _kind_split_kv,
        "none, heuristic (kernel picks the split count), fixed_count:<n>, fixed_size:<tokens>",
    ),
    _spec(
        "kv_page_size",
        _REC,
        _kind_positive_int,
        "paged-KV block size in tokens; null when KV is not paged",
        nullable=True,
    ),
    _spec(
        "kv_cache_dtype",
        _REC,
        _kind_str,
        "KV-cache dtype (auto, fp8, ...); null when there is no KV cache",
        nullable=True,
    ),
    _spec(
        "chunked_prefill_chunk",
        _REC,
        _kind_positive_int,
        "chunked-prefill token budget per step; null when prefill is not chunked",
        nullable=True,
    ),
    _spec("prefix_caching", _REC, _kind_bool, "KV prefix caching on; null when there is no KV cache", nullable=True),
    _spec("cp_size", _REC, _kind_positive_int, "context-parallel size"),
    _spec(
        "decode_cp_size",
        _REC,
        _kind_positive_int,
        "decode context-parallel size (vLLM decode_context_parallel_size); null when the engine does not decode",
        nullable=True,
    ),
    _spec(
        "cp_layout",
        _REC,
        _choice("none", "load_balanced", "contiguous"),
        "sequence layout over CP ranks (load_balanced: rank r holds chunks r and 2cp-1-r)",
    ),
    _spec(
        "cp_comm_type",
        _REC,
        _choice("p2p", "all_gather", "a2a", "a2a+p2p"),
        "CP communication; null when cp_size is 1",
        nullable=True,
    ),
    _spec("tp_size", _REC, _kind_positive_int, "tensor-parallel size"),
    _spec("mode", _REC, _choice(*MODES), "prefill (full-sequence forward), prefill+decode, chunked_prefill+decode"),
    _spec("rope_fusion", _REC, _kind_bool, "fused RoPE kernel; null when the engine has no such switch", nullable=True),
    _spec(
        "physical_batch",
        _REC,
        _kind_positive_int,
        "sequences per kernel launch (micro batch, max_num_seqs)",
        nullable=True,
    ),
    _spec(
        "batch_invariant",
        _REC,
        _kind_bool,
        "batch-invariant mode (Megatron batch_invariant_mode, VLLM_BATCH_INVARIANT)",
        nullable=True,
    ),
    _spec(
        "deterministic",
        _REC,
        _kind_bool,
        "deterministic mode (Megatron deterministic_mode); null when the engine has none",
        nullable=True,
    ),
    _spec(
        "flash_attention_version", _REC, _kind_positive_int, "flash-attn major version in use (2, 3, 4)", nullable=True
    ),
    _spec(
        "versions",
        _REC,
        _kind_mapping,
        "library versions: torch, megatron.core, transformer_engine, vllm, flash_attn, nccl",
    ),
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
