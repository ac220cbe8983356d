"""``probe CONFIG [OVERRIDES...]``: both sides read from a NeMo-RL recipe, as its workers build them.

The recipe is loaded as ``check`` loads it (``config.loader.load_config``) and read once into the
facts ``check`` reads (``preflight.recipe_facts``); with ``attention_align.preset: aligned`` the
settings the preset writes when the run starts are applied first (``aligning.preset.align``; no
kernel step: that needs the GPU the run will have). The sides are built from those facts alone:

* the training side (``TRAINING_ENGINE``) is megatron-core built through Megatron-Bridge from the
  checkpoint, with what NeMo-RL's ``nemo_rl/models/megatron/setup.py`` sets on the provider from
  the recipe and that changes one device's forward (``PolicyFacts.provider_settings``: the backend,
  ``apply_rope_fusion``, ``bias_activation_fusion``, ``layernorm_epsilon``, ``transformer_impl``,
  ``model_overrides``) in ``policy.precision``; ``policy.hf_config_overrides`` on the HF config the
  bridge converts; ``policy.megatron_cfg.env_vars`` in its environment;
* the rollout side is vLLM with the ``LLM(...)`` arguments NeMo-RL's ``VllmGenerationWorker``
  passes that a single-process prefill keeps (``dtype`` from ``vllm_cfg.precision``,
  ``max_model_len``, every ``policy.generation.vllm_kwargs`` but the executor's), and
  ``vllm_cfg.env_vars`` in its environment.

The checkpoint is ``policy.model_name`` unless ``checkpoint`` (a run's HF export) is given. What one
process cannot reproduce (tensor, pipeline, context and expert parallelism) is listed in ``notes``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.config.config_lookup import UNSET, is_count
from nemo_rl_attn_align.probe.sides import SideSpec
from nemo_rl_attn_align.vocab.errors import UsageError

if TYPE_CHECKING:
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

#: The engine of the training side (``sides.ENGINES``): Megatron-Bridge's model from the checkpoint.
TRAINING_ENGINE = "megatron-bridge"
#: ``vllm_kwargs`` the probe's one in-process engine does not take over (it runs no executor).
ENGINE_ONLY_KWARGS = ("distributed_executor_backend",)


@dataclass(frozen=True)
class RecipeSides:
    """Both sides of a recipe, and what the probe could not reproduce of it (or changed first)."""

    training: SideSpec
    rollout: SideSpec
    notes: tuple[str, ...] = ()


def as_run_starts(cfg: dict[str, Any], environ: Mapping[str, str]) -> tuple[RecipeFacts, list[str]]:
    """The facts of ``cfg`` with ``attention_align.preset: aligned``'s changes applied, and a note per change."""
    from nemo_rl_attn_align.aligning.preset import align
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    facts, settings = read_recipe_facts(cfg, environ), load_settings(cfg)
    if settings.preset != "aligned":
        return facts, []
    read = functools.partial(read_recipe_facts, environ=environ, files=facts.files)
    alignment = align(cfg, read, functools.partial(preview_binding, settings=settings, environ=environ))
    notes = [f"preset aligned sets {change.key}={change.value!r} ({change.reason})" for change in alignment.changes]
    return alignment.facts, notes


def training_side(facts: RecipeFacts, checkpoint: str) -> tuple[SideSpec, list[str]]:
    """The training side of the recipe read as ``facts`` (as the run starts: the preset already
    applied) on ``checkpoint``, and what one process cannot reproduce of it; a ``UsageError`` where
    the recipe does not train with Megatron."""
    policy = facts.require_policy()
    if policy.enabled_raw is not True:
        raise UsageError(
            "policy.megatron_cfg.enabled is not true: probe CONFIG compares Megatron training with its rollouts. "
            "Fix: probe a Megatron recipe, or give two side files"
        )
    precision = "bfloat16" if policy.precision_raw is UNSET else policy.precision_raw
    model = {"checkpoint": checkpoint, "precision": precision, **policy.provider_settings}
    if policy.hf_config_overrides:  # NeMo-RL: AutoBridge.from_hf_pretrained(name, **these)
        model["hf_config_overrides"] = dict(policy.hf_config_overrides)
    notes = [
        f"{count.key}={count.value} runs as 1 here (one process)"
        for count in policy.counts
        if count.key.startswith("policy.megatron_cfg.") and is_count(count.value) and count.value > 1
    ]
    return SideSpec("training", engine=TRAINING_ENGINE, model=model, env=dict(policy.env_vars)), notes


def rollout_side(facts: RecipeFacts, checkpoint: str) -> tuple[SideSpec, list[str]]:
    """The rollout side of the recipe read as ``facts`` (the preset already applied) on
    ``checkpoint``, and what it changed; a ``UsageError`` where the recipe does not generate with vLLM."""
    generation = facts.generation
    if generation.backend is None:
        raise UsageError(
            "the recipe sets no policy.generation.backend: it has no rollout engine to compare (SFT, DPO). "
            "Fix: probe a recipe that generates with vLLM, or give two side files"
        )
    if not generation.is_vllm:
        raise UsageError(
            f"policy.generation.backend={generation.backend!r}: probe CONFIG runs the rollout side on vLLM. "
            "Fix: probe a recipe that generates with vLLM, or give two side files"
        )
    precision, notes = generation.precision.value or "auto", []
    if precision == "fp8":  # NeMo-RL then runs vLLM in bfloat16 with its FP8 quantization (GPU only)
        precision = "bfloat16"
        notes.append(f"{generation.precision.key}=fp8: vLLM runs in bfloat16 without NeMo-RL's FP8 quantization")
    model = {"model": checkpoint, "dtype": precision}
    if generation.max_model_len is not None:
        model["max_model_len"] = generation.max_model_len
    kwargs = facts.policy.vllm_kwargs if facts.policy is not None else {}
    model.update({key: value for key, value in kwargs.items() if key not in ENGINE_ONLY_KWARGS})
    return SideSpec("rollout", engine="vllm", model=model, env=dict(generation.env_vars)), notes


def recipe_sides(
    cfg: dict[str, Any], checkpoint: str | None = None, environ: Mapping[str, str] | None = None
) -> RecipeSides:
    """Both sides of the resolved recipe ``cfg`` on ``checkpoint`` (default ``policy.model_name``)."""
    environ = os.environ if environ is None else environ
    facts, notes = as_run_starts(cfg, environ)
    checkpoint = checkpoint or facts.require_policy().model_name
    if not checkpoint:
        raise UsageError("policy.model_name is not set: the probe needs a checkpoint. Fix: set it or pass --checkpoint")
    if Path(checkpoint).exists():
        checkpoint = str(Path(checkpoint).resolve())
    training, training_notes = training_side(facts, checkpoint)
    rollout, rollout_notes = rollout_side(facts, checkpoint)
    return RecipeSides(training, rollout, tuple(notes + training_notes + rollout_notes))
