"""What a Megatron policy worker runs, read once: frozen ``ModelConfigSnapshot`` and ``InferenceSnapshot``.

``read_model_config`` reads the finished model config (a megatron-core ``TransformerConfig`` or a
Megatron-Bridge provider, which subclasses it) and the worker's batch sizes and tokenizer;
``read_inference`` adds what megatron-core's dynamic inference engine runs (its
``DynamicInferenceContext`` and the flash-attn generations found) when NeMo-RL generates with
Megatron. Values are read with ``getattr`` and kept JSON-ready (enums by name, dtypes as text,
tuples as lists); an attribute this megatron-core does not have is listed in ``absent``, never
guessed. ``contract.training`` and ``contract.megatron_generation_contract`` map the snapshots onto the
contract fields; the hooks keep their ``to_dict()`` in the worker's host detail. No host library
is imported here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

_MISSING = object()
_A = TypeVar("_A", bound="_Attributes")


def plain(value: Any) -> Any:
    """JSON-ready form of a config value: enums by name, dtypes as text, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return str(value)


def read_attributes(obj: Any, names: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``names`` of ``obj`` as JSON-ready values, and the names ``obj`` does not have."""
    values, absent = {}, []
    for name in names:
        value = getattr(obj, name, _MISSING)
        if value is _MISSING:
            absent.append(name)
        else:
            values[name] = plain(value)
    return values, tuple(absent)


class _Attributes:
    """A snapshot of some object's attributes: ``absent`` names those it did not have."""

    absent: tuple[str, ...]
    #: The attributes read, in order (the dataclass fields less the ones the subclass adds).
    ATTRIBUTES: ClassVar[tuple[str, ...]] = ()

    def has(self, name: str) -> bool:
        """Whether the object had attribute ``name`` (its value may still be None)."""
        return name not in self.absent

    def was_read(self) -> bool:
        """Whether any attribute was read (a snapshot of an object that could not be read has none)."""
        return len(self.absent) < len(self.ATTRIBUTES)

    @classmethod
    def unread(cls: type[_A]) -> _A:
        """The snapshot of an object that could not be read: every attribute absent."""
        return cls(absent=cls.ATTRIBUTES)  # type: ignore[call-arg]

    def attributes(self) -> dict[str, Any]:
        """The attributes the object had, by name, as read."""
        return {name: getattr(self, name) for name in self.ATTRIBUTES if self.has(name)}


@dataclass(frozen=True)
class ModelConfigSnapshot(_Attributes):
    """Every attribute of the finished model config that decides what attention computes (None:
    unset, or left at its default by a caller), and the worker's batch sizes and tokenizer."""

    attention_backend: str | None = None  # the AttnBackend name
    transformer_impl: str | None = None
    params_dtype: str | None = None  # "torch.bfloat16"
    bf16: bool | None = None
    fp16: bool | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    kv_channels: int | None = None
    softmax_scale: float | None = None
    attention_softmax_in_fp32: bool | None = None
    window_size: list[int] | None = None  # (left, right)
    window_attn_skip_freq: Any = None  # an int N or a per-layer list
    softmax_type: str | None = None
    multi_latent_attention: bool | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    experimental_attention_variant: str | None = None
    linear_attention_freq: Any = None  # an int N or a per-layer list (1: gated delta-net)
    hybrid_layer_pattern: str | None = None
    attention_output_gate: bool | None = None
    position_embedding_type: str | None = None
    rotary_base: float | None = None
    rotary_percent: float | None = None
    rotary_interleaved: bool | None = None
    seq_len_interpolation_factor: float | None = None
    rope_scaling: bool | None = None
    rope_scaling_factor: float | None = None
    # YaRN as Megatron-Bridge's providers carry it (megatron-core's GPTModel reads these)
    yarn_rotary_scaling_factor: float | None = None
    yarn_original_max_position_embeddings: int | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None
    yarn_correction_range_round_to_int: bool | None = None
    apply_rope_fusion: bool | None = None
    vocab_size: int | None = None
    tensor_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    cp_comm_type: Any = None  # a name or a per-layer list
    deterministic_mode: bool | None = None
    batch_invariant_mode: bool | None = None
    flash_attention_version: int | None = None
    config_class: str = "TransformerConfig"
    absent: tuple[str, ...] = ()
    train_micro_batch_size: int | None = None  # policy.train_micro_batch_size
    logprob_batch_size: int | None = None  # policy.logprob_batch_size
    tokenizer: str | None = None  # policy.tokenizer.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the class name, the attributes read, ``absent``, and the policy's values that are set."""
        policy = {
            key: value
            for key in ("train_micro_batch_size", "logprob_batch_size", "tokenizer")
            if (value := getattr(self, key)) is not None
        }
        return {"model_config_class": self.config_class, **self.attributes(), "absent": list(self.absent), **policy}


def _attribute_fields(cls: type, *others: str) -> tuple[str, ...]:
    """The dataclass fields of ``cls`` that hold the object's attributes: all but ``absent`` and ``others``."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("absent", *others))


ModelConfigSnapshot.ATTRIBUTES = _attribute_fields(
    ModelConfigSnapshot, "config_class", "train_micro_batch_size", "logprob_batch_size", "tokenizer"
)


def read_model_config(model_cfg: Any, policy_cfg: Mapping[str, Any] | None = None) -> ModelConfigSnapshot:
    """The attention-relevant attributes of the finished model config, plus the worker's batch sizes
    (when ints) and tokenizer name."""
    values, absent = read_attributes(model_cfg, ModelConfigSnapshot.ATTRIBUTES)
    policy_cfg = policy_cfg or {}
    batch = {
        key: policy_cfg[key] for key in ("train_micro_batch_size", "logprob_batch_size") if _is_int(policy_cfg.get(key))
    }
    tokenizer = policy_cfg.get("tokenizer")
    name = tokenizer.get("name") if isinstance(tokenizer, Mapping) else None
    return ModelConfigSnapshot(
        **values,
        config_class=type(model_cfg).__name__,
        absent=absent,
        tokenizer=name if isinstance(name, str) else None,
        **batch,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ContextSnapshot(_Attributes):
    """The ``DynamicInferenceContext`` settings (from its ``InferenceConfig``) the engine runs."""

    block_size_tokens: int | None = None
    max_tokens: int | None = None
    max_requests: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    use_flashinfer_fused_rope: bool | None = None
    params_dtype: str | None = None
    kv_cache_management_mode: str | None = None
    is_hybrid_model: bool | None = None
    absent: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**self.attributes(), "absent": list(self.absent)}


ContextSnapshot.ATTRIBUTES = _attribute_fields(ContextSnapshot)


@dataclass(frozen=True)
class InferenceSnapshot:
    """One Megatron generation worker: the generation model's config, its inference context, which
    flash-attn generations megatron-core found (``{"fa2", "fa3", "fa4"}`` -> bool; None: not read)
    and whether it generates colocated with training."""

    model: ModelConfigSnapshot = field(default_factory=ModelConfigSnapshot.unread)
    context: ContextSnapshot = field(default_factory=ContextSnapshot.unread)
    flash_available: Mapping[str, bool | None] = field(default_factory=dict)
    colocated: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "context": self.context.to_dict(),
            "flash_available": dict(self.flash_available),
            "colocated": self.colocated,
        }


def read_inference(
    model_cfg: Any,
    context: Any,
    flash_available: Mapping[str, bool | None],
    policy_cfg: Mapping[str, Any] | None = None,
    colocated: bool | None = None,
) -> InferenceSnapshot:
    """The generation model's config (as the training side reads it), the inference context's
    settings, and what megatron-core found installed."""
    values, absent = read_attributes(context, ContextSnapshot.ATTRIBUTES)
    return InferenceSnapshot(
        model=read_model_config(model_cfg, policy_cfg),
        context=ContextSnapshot(**values, absent=absent),
        flash_available=dict(flash_available),
        colocated=colocated,
    )
