"""The whole recipe, read once: ``RecipeFacts``, the layers' facts side by side (stdlib only).

``read_recipe_facts(cfg, environ)`` reads a resolved NeMo-RL config (a plain dict, as
``config.loader.load_config`` returns it): ``policy`` (``facts.PolicyFacts``: the pre-flight rules and the
training preview), ``generation`` (``generation_facts``: the vLLM rollout settings), ``shape``
(``shape_facts``: the layers drift resolves a shape from) and ``megatron_generation``
(``megatron_generation``: the generation model and engine when NeMo-RL generates with Megatron).
The rules, the preview and drift read only these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.preflight.config_lookup import positive_int, value_at
from nemo_rl_attn_align.preflight.facts import PolicyFacts, policy_not_a_mapping, read_policy_facts
from nemo_rl_attn_align.preflight.generation_facts import GenerationFacts, read_generation_facts
from nemo_rl_attn_align.preflight.megatron_generation import MegatronGenerationFacts, read_megatron_generation_facts
from nemo_rl_attn_align.preflight.model_facts import ModelFacts
from nemo_rl_attn_align.preflight.shape_facts import ShapeFacts, read_shape_facts


@dataclass(frozen=True)
class RecipeFacts:
    """A whole recipe's facts. ``policy`` is None when the ``policy`` section is not a mapping
    (``require_policy`` then raises the one-line error the rules' reader raises)."""

    policy: PolicyFacts | None
    generation: GenerationFacts
    shape: ShapeFacts
    #: ``policy.model_name`` as written (None when unset), which ``hf_model`` looks up locally.
    model_name: Any = None
    #: ``policy.tokenizer.name``, else ``policy.model_name`` (falsy when neither is set).
    tokenizer: Any = None
    #: ``grpo.num_prompts_per_step`` x ``grpo.num_generations_per_prompt`` when both are positive ints.
    rollout_batch_size: int | None = None
    #: the ``policy`` section as written (for the error ``require_policy`` raises).
    policy_raw: Any = None
    #: ``policy.generation.backend: megatron``: the generation model and engine (else None).
    megatron_generation: MegatronGenerationFacts | None = None

    @property
    def model(self) -> ModelFacts:
        """The model's attention as both hosts build it (``PolicyFacts.model``; unread without a policy)."""
        return self.policy.model if self.policy is not None else ModelFacts()

    @property
    def megatron_enabled(self) -> bool:
        """Whether NeMo-RL trains this policy with Megatron (see ``megatron_enabled``)."""
        return self.policy is not None and self.policy.megatron_enabled

    def require_policy(self) -> PolicyFacts:
        """``policy``, or the ``UsageError`` for a ``policy`` section that is not a mapping."""
        if self.policy is None:
            raise policy_not_a_mapping(self.policy_raw)
        return self.policy


def read_recipe_facts(cfg: Any, environ: Mapping[str, str] | None = None) -> RecipeFacts:
    """Read a resolved NeMo-RL config once; ``environ`` (default ``os.environ``) is the driver
    environment the workers inherit."""
    policy_raw = cfg.get("policy") if isinstance(cfg, Mapping) else None
    policy = read_policy_facts(policy_raw, environ) if isinstance(policy_raw, dict) else None
    prompts = positive_int(value_at(cfg, "grpo.num_prompts_per_step"))
    generations = positive_int(value_at(cfg, "grpo.num_generations_per_prompt"))
    return RecipeFacts(
        policy=policy,
        generation=read_generation_facts(cfg),
        shape=read_shape_facts(cfg),
        model_name=value_at(cfg, "policy.model_name"),
        tokenizer=value_at(cfg, "policy.tokenizer.name") or value_at(cfg, "policy.model_name"),
        rollout_batch_size=prompts * generations if prompts and generations else None,
        policy_raw=policy_raw,
        megatron_generation=read_megatron_generation_facts(policy_raw, environ),
    )


def as_facts(cfg: Any, environ: Mapping[str, str] | None = None) -> RecipeFacts:
    """``cfg`` when it already is ``RecipeFacts``, else ``read_recipe_facts(cfg, environ)``: the public
    functions of the preview and drift take either, so a caller reads the recipe once."""
    return cfg if isinstance(cfg, RecipeFacts) else read_recipe_facts(cfg, environ)
