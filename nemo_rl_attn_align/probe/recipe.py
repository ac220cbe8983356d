"""``probe CONFIG [OVERRIDES...]``: both sides read from a NeMo-RL recipe, as its workers build them.

The recipe is loaded as ``check`` loads it (``config.loader.load_config``), and with
``attention_align.preset: aligned`` the settings the preset writes when the run starts are applied
first (``aligning.preset.align``; no kernel step: that needs the GPU the run will have). Then:

* the training side (``TRAINING_ENGINE``) is megatron-core built through Megatron-Bridge from the
  checkpoint, with what NeMo-RL's ``nemo_rl/models/megatron/setup.py`` sets on the provider from
  the recipe and that changes one device's forward: ``policy.precision``, ``attention_backend``,
  ``apply_rope_fusion``, ``bias_activation_fusion``, ``layernorm_epsilon``, ``transformer_impl``,
  ``model_overrides``; ``policy.hf_config_overrides`` on the HF config the bridge converts;
  ``policy.megatron_cfg.env_vars`` in its environment;
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
from typing import Any

from nemo_rl_attn_align.config.config_lookup import as_env_vars, section
from nemo_rl_attn_align.probe.sides import SideSpec
from nemo_rl_attn_align.vocab.errors import UsageError

#: The engine of the training side (``sides.ENGINES``): Megatron-Bridge's model from the checkpoint.
TRAINING_ENGINE = "megatron-bridge"
#: ``policy.megatron_cfg`` keys NeMo-RL sets on the provider that change one device's forward.
MEGATRON_KEYS = ("apply_rope_fusion", "bias_activation_fusion", "layernorm_epsilon", "transformer_impl")
#: ``policy.megatron_cfg`` parallel sizes a single process runs as 1.
PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)
#: ``vllm_kwargs`` the probe's one in-process engine does not take over (it runs no executor).
ENGINE_ONLY_KWARGS = ("distributed_executor_backend",)


@dataclass(frozen=True)
class RecipeSides:
    """Both sides of a recipe, and what the probe could not reproduce of it (or changed first)."""

    training: SideSpec
    rollout: SideSpec
    notes: tuple[str, ...] = ()


def as_run_starts(cfg: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """``cfg`` with ``attention_align.preset: aligned``'s changes applied, and a note per change."""
    from nemo_rl_attn_align.aligning.preset import align
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    settings = load_settings(cfg)
    if settings.preset != "aligned":
        return cfg, []
    facts = read_recipe_facts(cfg, environ)
    read = functools.partial(read_recipe_facts, environ=environ, files=facts.files)
    alignment = align(cfg, read, functools.partial(preview_binding, settings=settings, environ=environ))
    notes = [f"preset aligned sets {change.key}={change.value!r} ({change.reason})" for change in alignment.changes]
    return dict(alignment.config), notes


def training_side(cfg: Mapping[str, Any], checkpoint: str) -> tuple[SideSpec, list[str]]:
    """The training side of the resolved recipe ``cfg`` on ``checkpoint`` (as the run starts: the
    preset already applied), and what one process cannot reproduce of it; a ``UsageError`` where
    the recipe does not train with Megatron."""
    policy, megatron = section(cfg, "policy"), section(cfg, "policy.megatron_cfg")
    if megatron.get("enabled") is not True:
        raise UsageError(
            "policy.megatron_cfg.enabled is not true: probe CONFIG compares Megatron training with its rollouts. "
            "Fix: probe a Megatron recipe, or give two side files"
        )
    provider = {key: megatron[key] for key in MEGATRON_KEYS if key in megatron}
    if megatron.get("attention_backend") is not None:
        provider["attention_backend"] = megatron["attention_backend"]
    provider.update(megatron.get("model_overrides") or {})
    model = {"checkpoint": checkpoint, "precision": policy.get("precision", "bfloat16"), **provider}
    if section(cfg, "policy.hf_config_overrides"):  # NeMo-RL: AutoBridge.from_hf_pretrained(name, **these)
        model["hf_config_overrides"] = dict(section(cfg, "policy.hf_config_overrides"))
    notes = [
        f"policy.megatron_cfg.{key}={megatron[key]} runs as 1 here (one process)"
        for key in PARALLEL_KEYS
        if isinstance(megatron.get(key), int) and megatron[key] > 1
    ]
    return SideSpec("training", engine=TRAINING_ENGINE, model=model, env=as_env_vars(megatron.get("env_vars"))), notes


def rollout_side(cfg: Mapping[str, Any], checkpoint: str) -> tuple[SideSpec, list[str]]:
    """The rollout side of the resolved recipe ``cfg`` on ``checkpoint`` (the preset already applied),
    and what it changed; a ``UsageError`` where the recipe does not generate with vLLM."""
    generation = section(cfg, "policy.generation")
    if not generation:
        raise UsageError(
            "policy.generation is not set: the recipe has no rollout engine to compare (SFT, DPO). "
            "Fix: probe a recipe that generates with vLLM, or give two side files"
        )
    if generation.get("backend") != "vllm":
        raise UsageError(
            f"policy.generation.backend={generation.get('backend')!r}: probe CONFIG runs the rollout side on vLLM. "
            "Fix: probe a recipe that generates with vLLM, or give two side files"
        )
    vllm_cfg, kwargs = section(cfg, "policy.generation.vllm_cfg"), section(cfg, "policy.generation.vllm_kwargs")
    precision, notes = vllm_cfg.get("precision", "auto"), []
    if precision == "fp8":  # NeMo-RL then runs vLLM in bfloat16 with its FP8 quantization (GPU only)
        precision = "bfloat16"
        notes.append(
            "policy.generation.vllm_cfg.precision=fp8: vLLM runs in bfloat16 without NeMo-RL's FP8 quantization"
        )
    model = {"model": checkpoint, "dtype": precision}
    if vllm_cfg.get("max_model_len") is not None:
        model["max_model_len"] = vllm_cfg["max_model_len"]
    model.update({key: value for key, value in kwargs.items() if key not in ENGINE_ONLY_KWARGS})
    return SideSpec("rollout", engine="vllm", model=model, env=as_env_vars(vllm_cfg.get("env_vars"))), notes


def recipe_sides(
    cfg: dict[str, Any], checkpoint: str | None = None, environ: Mapping[str, str] | None = None
) -> RecipeSides:
    """Both sides of the resolved recipe ``cfg`` on ``checkpoint`` (default ``policy.model_name``)."""
    environ = os.environ if environ is None else environ
    cfg, notes = as_run_starts(cfg, environ)
    checkpoint = checkpoint or section(cfg, "policy").get("model_name")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise UsageError("policy.model_name is not set: the probe needs a checkpoint. Fix: set it or pass --checkpoint")
    if Path(checkpoint).exists():
        checkpoint = str(Path(checkpoint).resolve())
    training, training_notes = training_side(cfg, checkpoint)
    rollout, rollout_notes = rollout_side(cfg, checkpoint)
    return RecipeSides(training, rollout, tuple(notes + training_notes + rollout_notes))
