"""Bind the predicted contracts: what ``check`` shows before launch, and what the preset aligns.

``preview_binding(facts, settings, environ)`` takes the recipe read once (``RecipeFacts``, read where
the run starts: ``check``, the driver hook) and the ``attention_align`` settings, predicts both contracts
(``contract.contract_preview``) and the determinism diff the workers would report (``env_vars`` over the
driver's environment, Megatron's deterministic mode and vLLM's batch-invariant mode applied), and
binds them under the settings' mandate. ``report.report_render.render_preview`` prints it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from nemo_rl_attn_align.binding.binding import BindingReport, bind
from nemo_rl_attn_align.binding.determinism import collective_for, compare, probe
from nemo_rl_attn_align.binding.profiles import PROFILES
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.contract.contract_preview import absent_sides, predict_rollout, predict_training, worker_env
from nemo_rl_attn_align.preflight.behaviour_facts import FLAGS
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.vocab.mandate import Mandate

if TYPE_CHECKING:
    from nemo_rl_attn_align.config.settings import AlignSettings

#: The vLLM batch-invariant profile the preview assumes (vLLM's version is known only at start).
_VLLM_BI_PROFILE = "vllm-batch-invariant-0.33"


def _predict_determinism(
    facts: RecipeFacts, environ: Mapping[str, str], training: AttentionContract, rollout: AttentionContract
):
    """The determinism diff the workers would report, from the config and ``environ``, with notes: the
    problems a framework mode would stop on (e.g. Megatron's deterministic mode rejecting Tree) and
    the vLLM batch-invariant profile assumed."""
    t_env = worker_env(facts, "training", environ)
    notes: list[str] = []
    if facts.policy is not None and facts.policy.model_overrides.get("deterministic_mode"):
        t_env, found = PROFILES["megatron-deterministic"].apply(t_env)
        notes.extend(f"determinism: {p}" for p in found)
    r_env = worker_env(facts, "rollout", environ)
    if facts.megatron_generation is not None:  # the policy workers generate: their environment
        r_env = t_env
    elif vllm_batch_invariant(r_env):
        r_env, found = PROFILES[_VLLM_BI_PROFILE].apply(r_env)
        notes.extend(f"determinism: {p}" for p in found)
        notes.append(
            f"rollout environment predicted with {PROFILES[_VLLM_BI_PROFILE].versions}; "
            f"{PROFILES['vllm-batch-invariant'].versions} sets NCCL_ALGO=allreduce:tree, the same allreduce meaning"
        )
    collective = collective_for(training.known_value("tp_size"), rollout.known_value("tp_size"))
    return compare(probe(t_env, torch_module=False), probe(r_env, torch_module=False), collective), notes


def _behaviour_notes(facts: RecipeFacts) -> list[str]:
    """How each side's ``rope``, ``mask`` and ``softmax`` were computed before launch, or which ``check``
    options compute them (a vLLM rollout: both sides' hosts can)."""
    if not facts.behaviour:
        if facts.megatron_generation is not None:
            return []
        return [
            "rope, mask and softmax pending: each worker measures them from its attention modules at start; "
            f"check {FLAGS['training']} PY {FLAGS['rollout']} PY (the Python of NeMo-RL's Megatron and vLLM "
            "worker venvs) or --behaviour (this Python's hosts) computes them before launch with the hosts' own code"
        ]
    notes = []
    for computed in facts.behaviour:
        if computed.why_not is not None:
            notes.append(f"{computed.side} rope, mask and softmax not computed ({computed.python}): {computed.why_not}")
            continue
        replaced = f"; to build it here: {', '.join(computed.substitutions)}" if computed.substitutions else ""
        notes.append(
            f"{computed.side} rope, mask and softmax computed by {computed.host} ({computed.python}) in "
            f"{computed.seconds} s, on the meta device{replaced}"
        )
    return notes


class BindingPreview(NamedTuple):
    """What ``check`` shows: both predicted contracts (``None`` where the config has no such side),
    the predicted binding (``None`` unless both exist) and notes on assumptions and problems."""

    training: AttentionContract | None
    rollout: AttentionContract | None
    binding: BindingReport | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "training": self.training.to_dict() if self.training else None,
            "rollout": self.rollout.to_dict() if self.rollout else None,
            "binding": self.binding.to_dict() if self.binding else None,
            "verdict": self.binding.verdict.value if self.binding else None,
            "notes": list(self.notes),
        }


def preview_binding(
    facts: RecipeFacts,
    settings: AlignSettings,
    environ: Mapping[str, str],
    rollout_backends: Collection[str] | None = None,
) -> BindingPreview:
    """Predict both contracts and bind them under ``settings``' mandate. ``facts`` is the recipe read
    with ``environ``, the driver environment the workers inherit (as ``plan.build_plan`` reads it);
    ``rollout_backends``, the backends vLLM's selector picks on the GPU ``check --gpu`` predicts for."""
    model = facts.model
    training = predict_training(facts)
    rollout = predict_rollout(facts, environ, rollout_backends)
    notes = [f"no {side} contract: {why}" for side, why in absent_sides(facts).items()]
    if model.config is not None:
        notes.append(f"identity read from {model.config.path} (local; never fetched)")
    elif training is not None and rollout is not None:
        notes.append(f"identity pending: {model.unread}")
    if training is None or rollout is None:
        return BindingPreview(training, rollout, None, tuple(notes))
    notes.extend(_behaviour_notes(facts))
    diff, found = _predict_determinism(facts, environ, training, rollout)
    notes.extend(found)
    mandate: Mandate = settings.mandate
    binding = bind(training, rollout, mandate, allow_dtype_difference=settings.allow_dtype_difference, determinism=diff)
    return BindingPreview(training, rollout, binding, tuple(notes))
