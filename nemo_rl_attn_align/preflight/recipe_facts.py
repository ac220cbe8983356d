"""The whole recipe, read once: ``RecipeFacts``, the layers' facts side by side (stdlib only).

``read_recipe_facts(cfg, environ)`` reads a resolved NeMo-RL config (a plain dict, as
``config.loader.load_config`` returns it): ``policy`` (``facts.PolicyFacts``: the pre-flight rules and the
training preview), ``generation`` (``generation_facts``: the vLLM rollout settings), ``shape``
(``ShapeFacts``: the ``attention_align.drift`` block and the sequence length, which drift resolves
its sweep's shape from before the model's own attention) and ``megatron_generation``
(``megatron_generation_facts``: the generation model and engine when NeMo-RL generates with Megatron).
The model's ``config.json`` and the tokenizer's identity are read once (``LocalFiles``) and kept
across the configs an entry point reads (the preset's rounds pass them on). The rules, the preview
and drift read only these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.config.config_lookup import UNSET, Fact, positive_int, value_at
from nemo_rl_attn_align.model.model_config import ConfigNotRead, HFModelConfig, load_model_config
from nemo_rl_attn_align.model.model_facts import ModelFacts
from nemo_rl_attn_align.preflight.behaviour_facts import ComputedBehaviour
from nemo_rl_attn_align.preflight.facts import PolicyFacts, policy_not_a_mapping, read_policy_facts
from nemo_rl_attn_align.preflight.generation_facts import GenerationFacts, read_generation_facts
from nemo_rl_attn_align.preflight.megatron_generation_facts import (
    MegatronGenerationFacts,
    read_megatron_generation_facts,
)
from nemo_rl_attn_align.preflight.tokenizer import TokenizerIdentity, tokenizer_identity
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.limits import shown
from nemo_rl_attn_align.vocab.names import BLOCK


@dataclass(frozen=True)
class LocalFiles:
    """The recipe's files on this machine: the model's ``config.json`` (``ConfigNotRead``: not here,
    or not usable) and the tokenizer's identity, each with the name it was read for."""

    model_name: Any
    model_config: HFModelConfig | ConfigNotRead
    tokenizer_name: Any
    tokenizer: TokenizerIdentity

    @property
    def unusable(self) -> str | None:
        """One line when the model's config.json or a tokenizer file is there but cannot be used
        (unreadable, not JSON, a value over a limit); None when they are usable or not here."""
        if isinstance(self.model_config, ConfigNotRead) and not self.model_config.missing:
            return self.model_config.line
        if self.tokenizer.unreadable is not None:
            return (
                f"tokenizer {shown(self.tokenizer_name)}: {self.tokenizer.unreadable}; NeMo-RL's tokenizer loads it. "
                "Fix: make it readable, or set policy.tokenizer.name to a directory whose tokenizer files can be read."
            )
        return None


def read_local_files(model_name: Any, tokenizer_name: Any, known: LocalFiles | None = None) -> LocalFiles:
    """The files of ``model_name`` and ``tokenizer_name``, reusing ``known``'s where the names are the same."""
    if known is None or known.model_name != model_name or known.tokenizer_name != tokenizer_name:
        return LocalFiles(model_name, load_model_config(model_name), tokenizer_name, tokenizer_identity(tokenizer_name))
    return known


@dataclass(frozen=True)
class ShapeFacts:
    """What the config says about the sweep's attention shape, in drift's field names (``heads``,
    ``kv_heads``, ``head_dim``, ``window``, ``hidden``, ``seq_len``).

    ``layers`` are the config's sections that set shape fields, highest priority first (the
    ``attention_align.drift`` block), each a ``Fact`` whose value maps field -> value and whose key
    is the section; ``seq_len`` is ``policy.max_total_sequence_length`` (None when unset)."""

    layers: tuple[Fact, ...] = ()
    seq_len: Fact | None = None


def read_shape_facts(cfg: Any) -> ShapeFacts:
    """Read the drift block and the sequence length of a resolved config."""
    drift = value_at(cfg, f"{BLOCK}.drift")
    layers = (Fact(dict(drift), f"{BLOCK}.drift"),) if isinstance(drift, dict) else ()
    seq = value_at(cfg, "policy.max_total_sequence_length")
    return ShapeFacts(layers, Fact(seq, "policy.max_total_sequence_length") if seq is not None else None)


@dataclass(frozen=True)
class RecipeFacts:
    """A whole recipe's facts. ``policy`` is None when the ``policy`` section is not a mapping
    (``require_policy`` then raises the one-line error the rules' reader raises)."""

    policy: PolicyFacts | None
    generation: GenerationFacts
    shape: ShapeFacts
    #: ``policy.model_name``'s config.json and ``policy.tokenizer.name`` (else ``policy.model_name``)'s identity.
    files: LocalFiles
    #: ``grpo.num_prompts_per_step`` x ``grpo.num_generations_per_prompt`` when both are positive ints.
    rollout_batch_size: int | None = None
    #: the ``policy`` section as written (``UNSET`` when absent; for the errors a missing policy raises).
    policy_raw: Any = UNSET
    #: ``policy.generation.backend: megatron``: the generation model and engine (else None).
    megatron_generation: MegatronGenerationFacts | None = None
    #: The behaviour fields each side's host computed before launch (``check --training-python``, ...).
    behaviour: tuple[ComputedBehaviour, ...] = ()

    @property
    def model(self) -> ModelFacts:
        """The model's attention as both hosts build it (``PolicyFacts.model``; unread without a policy)."""
        return self.policy.model if self.policy is not None else ModelFacts()

    @property
    def megatron_enabled(self) -> bool:
        """Whether NeMo-RL trains this policy with Megatron (see ``megatron_enabled``)."""
        return self.policy is not None and self.policy.megatron_enabled

    def behaviour_of(self, side: str) -> ComputedBehaviour | None:
        """What the host computed for contract side ``side`` before launch (None: not asked)."""
        return next((computed for computed in self.behaviour if computed.side == side), None)

    def require_usable_model(self) -> None:
        """Raise the ``UsageError`` for a model config.json or tokenizer file that is there but cannot
        be used, or a recipe override of the model's values over a limit (``check`` and ``drift`` stop
        on it: exit 2; a run's driver goes on, that side's model or the tokenizer identity pending)."""
        generation = self.megatron_generation.model.model if self.megatron_generation is not None else None
        for line in (self.files.unusable, self.model.unusable, generation.unusable if generation else None):
            if line is not None:
                raise UsageError(line)

    def require_policy(self) -> PolicyFacts:
        """``policy``, or the ``UsageError`` for a config without a ``policy`` section or with one that
        is not a mapping."""
        if self.policy_raw is UNSET:
            raise UsageError(
                "the config has no `policy:` section. Fix: pass a NeMo-RL recipe config (GRPO, SFT, DPO, ...)."
            )
        if self.policy is None:
            raise policy_not_a_mapping(self.policy_raw)
        return self.policy


def read_recipe_facts(
    cfg: Mapping[str, Any], environ: Mapping[str, str] | None = None, files: LocalFiles | None = None
) -> RecipeFacts:
    """Read a resolved NeMo-RL config once; ``environ`` (default ``os.environ``) is the driver
    environment the workers inherit; ``files``, those an earlier reading of the recipe read."""
    policy_raw = cfg.get("policy", UNSET) if isinstance(cfg, Mapping) else UNSET
    local = read_local_files(
        value_at(cfg, "policy.model_name"),
        value_at(cfg, "policy.tokenizer.name") or value_at(cfg, "policy.model_name"),
        files,
    )
    model_config = local.model_config
    policy = read_policy_facts(policy_raw, environ, model_config) if isinstance(policy_raw, dict) else None
    prompts = positive_int(value_at(cfg, "grpo.num_prompts_per_step"))
    generations = positive_int(value_at(cfg, "grpo.num_generations_per_prompt"))
    return RecipeFacts(
        policy=policy,
        generation=read_generation_facts(cfg),
        shape=read_shape_facts(cfg),
        files=local,
        rollout_batch_size=prompts * generations if prompts and generations else None,
        policy_raw=policy_raw,
        megatron_generation=read_megatron_generation_facts(policy_raw, environ, model_config),
    )
