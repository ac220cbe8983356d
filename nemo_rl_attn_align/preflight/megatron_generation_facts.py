"""``policy.generation.backend: megatron``: the generation model's settings, read as NeMo-RL builds them.

NeMo-RL main (7ea279a, ``nemo_rl/models/generation/megatron/config.py``) generates with the
policy's own Megatron workers. Not colocated, a dedicated inference ``Policy`` runs with
``merged_inference_megatron_cfg``: ``megatron_cfg`` with ``mcore_generation_config`` merged over it
(shallow) and ``activation_checkpointing`` off. Colocated, the training model generates unless
that merge (with context parallelism pinned to 1) differs from training in layout (TP, PP, EP,
ETP, CP) or ``transformer_impl`` (``dedicated_inference_megatron_cfg``); then a second model is
built from the merge. ``facts.generation_model_config`` mirrors both rules;
``read_megatron_generation_facts`` reads the generation model's ``megatron_cfg`` into ``PolicyFacts``
(the same reader as training), plus the inference engine's own keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.config.config_lookup import section
from nemo_rl_attn_align.preflight.facts import UNSET, Fact, PolicyFacts, generation_model_config, read_policy_facts

_GEN = "policy.generation.mcore_generation_config"


@dataclass(frozen=True)
class MegatronGenerationFacts:
    """What Megatron generation will run: whether it is colocated, whether a model of its own is
    built, that model's ``megatron_cfg`` read as ``PolicyFacts`` (``model_key`` names where its
    values come from), and the inference engine's keys (``mcore_generation_config``)."""

    colocated: bool
    dedicated: bool
    model: PolicyFacts
    model_key: str
    block_size_tokens: Fact = Fact(None, f"{_GEN}.block_size_tokens")
    max_tokens: Fact = Fact(None, f"{_GEN}.max_tokens")
    enable_chunked_prefill: Fact = Fact(None, f"{_GEN}.enable_chunked_prefill")
    enable_prefix_caching: Fact = Fact(None, f"{_GEN}.enable_prefix_caching")
    #: ``mcore_generation_config`` keys that replace a ``megatron_cfg`` value in the merge.
    overridden: tuple[str, ...] = ()


def read_megatron_generation_facts(
    policy_cfg: Any, environ: Mapping[str, str] | None = None, model_config: Any = UNSET
) -> MegatronGenerationFacts | None:
    """The facts of a ``policy`` section whose generation backend is megatron, else None
    (``model_config``: the model's ``config.json`` already read, as ``read_policy_facts`` takes it)."""
    found = generation_model_config(policy_cfg)
    if found is None:
        return None
    model_cfg, dedicated, model_key = found
    generation = section(policy_cfg, "generation")
    megatron_cfg, engine_cfg = section(policy_cfg, "megatron_cfg"), section(generation, "mcore_generation_config")
    model = read_policy_facts({**policy_cfg, "megatron_cfg": model_cfg}, environ, model_config)
    overridden = tuple(sorted(k for k in engine_cfg if k in megatron_cfg and engine_cfg[k] != megatron_cfg[k]))
    return MegatronGenerationFacts(
        colocated=section(generation, "colocated").get("enabled") is not False,
        dedicated=dedicated,
        model=model,
        model_key=model_key,
        block_size_tokens=Fact(engine_cfg.get("block_size_tokens"), f"{_GEN}.block_size_tokens"),
        max_tokens=Fact(engine_cfg.get("max_tokens"), f"{_GEN}.max_tokens"),
        enable_chunked_prefill=Fact(engine_cfg.get("enable_chunked_prefill"), f"{_GEN}.enable_chunked_prefill"),
        enable_prefix_caching=Fact(engine_cfg.get("enable_prefix_caching"), f"{_GEN}.enable_prefix_caching"),
        overridden=overridden if dedicated else (),
    )


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
