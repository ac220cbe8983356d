"""The generation layer of a recipe: ``policy.generation`` read into frozen ``GenerationFacts``.

What the rollout preview and the kernel predictions read about the rollout engine (vLLM's
settings, its workers' environment); ``recipe_facts.read_recipe_facts`` calls ``read_generation_facts``.
Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.config.config_lookup import Fact, as_env_vars, value_at

_VLLM_CFG = "policy.generation.vllm_cfg"


def vllm_batch_invariant(env: Mapping[str, str | None]) -> bool:
    """Whether ``VLLM_BATCH_INVARIANT`` turns the mode on (vLLM reads it as an integer != 0)."""
    try:
        return int(env.get("VLLM_BATCH_INVARIANT") or "0") != 0
    except ValueError:
        return False


@dataclass(frozen=True)
class GenerationFacts:
    """``policy.generation``: the rollout backend and, for vLLM, the settings the rollout preview reads.
    A value is as written, or vLLM's / NeMo-RL's default where the key is absent; None when unset."""

    backend: Any = None
    #: ``vllm_cfg.precision`` when present, else ``policy.precision`` (the key says which).
    precision: Fact = Fact(None, f"{_VLLM_CFG}.precision")
    kv_cache_dtype: Fact = Fact("auto", f"{_VLLM_CFG}.kv_cache_dtype")
    tensor_parallel_size: Fact = Fact(1, f"{_VLLM_CFG}.tensor_parallel_size")
    enable_prefix_caching: Fact = Fact(None, f"{_VLLM_CFG}.enable_prefix_caching")
    #: ``vllm_cfg.max_model_len`` as written (None: unset; vLLM then takes the model's own).
    max_model_len: Any = None
    #: ``vllm_cfg.env_vars`` as the worker gets them.
    env_vars: Mapping[str, str] = field(default_factory=dict)
    #: ``vllm_kwargs`` values (engine arguments).
    attention_backend: Any = None
    #: ``vllm_kwargs.attention_config.flash_attn_version``: the flash-attn generation FLASH_ATTN is pinned to.
    flash_attn_version: Any = None
    block_size: Any = None
    enable_chunked_prefill: Any = True
    max_num_batched_tokens: Any = None
    max_num_seqs: Any = None

    @property
    def is_vllm(self) -> bool:
        """Whether NeMo-RL starts vLLM generation workers (``policy.generation.backend: vllm``)."""
        return self.backend == "vllm"


def _mapping(node: Any, key: str) -> Mapping[str, Any]:
    """``node[key]`` when it is a mapping, else empty (a malformed section is NeMo-RL's to report)."""
    value = node.get(key) if isinstance(node, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def read_generation_facts(cfg: Any) -> GenerationFacts:
    """Read ``policy.generation`` of a resolved config (empty facts where it is not a mapping)."""
    gen = value_at(cfg, "policy.generation")
    if not isinstance(gen, Mapping):
        return GenerationFacts()
    vcfg, kwargs = _mapping(gen, "vllm_cfg"), _mapping(gen, "vllm_kwargs")
    return GenerationFacts(
        backend=gen.get("backend"),
        precision=(
            Fact(vcfg["precision"], f"{_VLLM_CFG}.precision")
            if "precision" in vcfg
            else Fact(value_at(cfg, "policy.precision"), "policy.precision")
        ),
        kv_cache_dtype=Fact(vcfg.get("kv_cache_dtype", "auto"), f"{_VLLM_CFG}.kv_cache_dtype"),
        tensor_parallel_size=Fact(vcfg.get("tensor_parallel_size", 1), f"{_VLLM_CFG}.tensor_parallel_size"),
        enable_prefix_caching=Fact(vcfg.get("enable_prefix_caching"), f"{_VLLM_CFG}.enable_prefix_caching"),
        max_model_len=vcfg.get("max_model_len"),
        env_vars=as_env_vars(value_at(cfg, f"{_VLLM_CFG}.env_vars")),
        attention_backend=kwargs.get("attention_backend"),
        flash_attn_version=_mapping(kwargs, "attention_config").get("flash_attn_version"),
        block_size=kwargs.get("block_size"),
        enable_chunked_prefill=kwargs.get("enable_chunked_prefill", True),
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens"),
        max_num_seqs=kwargs.get("max_num_seqs"),
    )
