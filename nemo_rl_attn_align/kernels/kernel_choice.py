"""The kernel step of ``preset: aligned`` and ``check --fix``: one flash-attn generation on both sides.

Once the semantic and determinism tiers pass, ``choose`` looks, on the GPU the kernels are
predicted for (``kernels.kernel_prediction``: the hosts' own selectors, or their tables), for the fewest
settings after which the training kernel and every rollout kernel run the same flash-attn
generation and no pair a host documents as mismatching (``kernel_pairs``) remains:

* training: TE's ``NVTE_FLASH_ATTN_V2/_V3/_V4`` in ``policy.megatron_cfg.env_vars`` (read by TE 2.20
  and later), and ``attention_backend: flash`` (a kernel change: ``check --fix`` only);
* rollout: vLLM's ``vllm_kwargs.attention_config.flash_attn_version`` and
  ``vllm_kwargs.attention_backend`` (FLASH_ATTN, or TRITON_ATTN where no flash pair exists);
  Megatron generation's ``model_overrides.flash_attention_version`` (a change to the policy's model
  config: ``check --fix`` only), to a flash-attn that runs there (2; 3 on sm90 with ``--fa3``; 4 is
  not assumed installed), and not 2 under batch-invariant mode (megatron-core asserts 3 or 4).

Where no setting gives one generation on that GPU, it keeps the closest pair (no documented
mismatch, the fewest changes) and says so (``KERNEL_PAIR_SPLIT``). Stdlib only.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.kernels.kernel_pairs import one_generation, pair_findings
from nemo_rl_attn_align.kernels.kernel_prediction import (
    megatron_flash_kernel,
    plan_kernels,
    predict_rollout,
    predict_training,
)
from nemo_rl_attn_align.kernels.kernel_query import (
    FLASH_GENERATIONS,
    Kernel,
    KernelOptions,
    KernelPlan,
    KindKernel,
    RolloutQuery,
    TrainingQuery,
    flash_pin_switches,
)
from nemo_rl_attn_align.vocab.change import Change
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding

if TYPE_CHECKING:
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

_TE_ENV = "policy.megatron_cfg.env_vars"
_VLLM_KWARGS = "policy.generation.vllm_kwargs"
#: The backends the rollout may be forced to: the flash-attn one, and the one that runs where it cannot.
ROLLOUT_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")


@dataclass(frozen=True)
class _Setting:
    """One side's settings: the config changes, how they change that side's selector queries (or the
    kernel they give a kind without one: Megatron generation's), and how many settings they are (a
    pin of three switches is one)."""

    changes: tuple[Change, ...] = ()
    updates: Mapping[str, Any] = field(default_factory=dict)
    count: int = 0
    kernel: Kernel | None = None


@dataclass(frozen=True)
class KernelChoice:
    """What the kernel step chose: the changes, the pair they give, whether it is one flash-attn
    generation, and the warning when it is not."""

    changes: tuple[Change, ...]
    training: str
    rollout: str
    one_generation: bool
    finding: Finding | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "training": self.training,
            "rollout": self.rollout,
            "one_generation": self.one_generation,
            "finding": self.finding.to_dict() if self.finding else None,
        }


def _training_settings(query: TrainingQuery, alter_ok: bool) -> list[_Setting]:
    """TE as configured, pinned to each flash-attn generation, and (``alter_ok``) with ``flash``."""
    out = [_Setting()]
    backends = ["flash"] if query.backend == "flash" else ["flash", query.backend] if alter_ok else [query.backend]
    for backend, generation in itertools.product(backends, (None, *FLASH_GENERATIONS)):
        changes: list[Change] = []
        updates: dict[str, Any] = {}
        if backend != query.backend:
            why = "TE's FlashAttention, the flash-attn kernel the rollout can run too"
            changes.append(Change("policy.megatron_cfg.attention_backend", "flash", why, alters_run=True))
            updates["backend"] = backend
        if generation is not None:
            switches = flash_pin_switches(generation)
            why = f"TE runs flash-attn {generation} only (NVTE_FLASH_ATTN_V*, TE 2.20 and later)"
            changes += [Change(f"{_TE_ENV}.{name}", value, why) for name, value in switches]
            updates["flash_switches"] = switches
        if changes:
            out.append(_Setting(tuple(changes), updates, (backend != query.backend) + (generation is not None)))
    return out


def _rollout_settings(query: RolloutQuery) -> list[_Setting]:
    """vLLM as configured, FLASH_ATTN pinned to each generation, forced FLASH_ATTN or TRITON_ATTN."""
    out = [_Setting()]
    for backend, generation in itertools.product((None, *ROLLOUT_BACKENDS), (None, *FLASH_GENERATIONS)):
        if generation is not None and backend not in (None, "FLASH_ATTN"):
            continue
        changes: list[Change] = []
        updates: dict[str, Any] = {}
        if backend is not None and backend != query.forced_backend:
            why = f"vLLM runs {backend} (vllm_kwargs.attention_backend)"
            changes.append(Change(f"{_VLLM_KWARGS}.attention_backend", backend, why))
            updates["forced_backend"] = backend
        if generation is not None and generation != query.flash_attn_version:
            why = f"vLLM's FLASH_ATTN runs flash-attn {generation} (attention_config.flash_attn_version)"
            changes.append(Change(f"{_VLLM_KWARGS}.attention_config.flash_attn_version", generation, why))
            updates["flash_attn_version"] = generation
        if changes:
            out.append(_Setting(tuple(changes), updates, len(changes)))
    return out


def _megatron_settings(gpu: str, options: KernelOptions, invariant_mode: bool) -> list[_Setting]:
    """Megatron generation pinned to each flash-attn generation that runs on ``gpu`` as installed."""
    runs = {2: not invariant_mode, 3: gpu == "sm90" and options.flash_attn_3, 4: False}  # FA4: not assumed
    key = "policy.megatron_cfg.model_overrides.flash_attention_version"
    out = [_Setting()]
    for generation in FLASH_GENERATIONS:
        if runs[generation]:
            why = f"megatron-core's inference calls flash-attn {generation} (Attention._resolve_flash_version)"
            change = Change(key, generation, why, alters_run=True)
            out.append(_Setting((change,), count=1, kernel=megatron_flash_kernel(generation, options)))
    return out


def _with(plan: KernelPlan, training: _Setting, rollout: _Setting, options: KernelOptions) -> KernelPlan:
    """``plan`` with each side's queries updated and answered again."""

    def again(kinds: tuple[KindKernel, ...], setting: _Setting, predict) -> tuple[KindKernel, ...]:
        if not setting.updates and setting.kernel is None:
            return kinds
        out = []
        for kind in kinds:
            if kind.query is None:
                out.append(replace(kind, kernel=setting.kernel) if setting.kernel is not None else kind)
                continue
            query = replace(kind.query, **setting.updates)
            out.append(replace(kind, query=query, kernel=predict(query, options)))
        return tuple(out)

    return replace(
        plan,
        training=again(plan.training, training, predict_training),
        rollout=again(plan.rollout, rollout, predict_rollout),
    )


def _rollout_side_settings(
    plan: KernelPlan, options: KernelOptions, alter_ok: bool, invariant_mode: bool
) -> list[_Setting] | None:
    """The rollout's settings to try: vLLM's, or Megatron generation's (``check --fix`` only); None:
    nothing to choose."""
    queries = [kind.query for kind in plan.rollout]
    if not queries or plan.gpu is None or not _runs(plan):
        return None
    if all(isinstance(q, RolloutQuery) for q in queries):
        return _rollout_settings(queries[0])  # type: ignore[arg-type]
    if all(q is None and kind.kernel.kernel == "flash_attn" for q, kind in zip(queries, plan.rollout, strict=True)):
        return _megatron_settings(plan.gpu, options, invariant_mode) if alter_ok else [_Setting()]
    return None


def _runs(plan: KernelPlan) -> bool:
    """Whether every kind on both sides has a kernel (none pending, none refused)."""
    return all(kind.kernel.known and kind.kernel.kernel is not None for kind in (*plan.training, *plan.rollout))


def choose(
    plan: KernelPlan, options: KernelOptions = KernelOptions(), alter_ok: bool = False, invariant_mode: bool = False
) -> KernelChoice | None:
    """The fewest settings after which ``plan``'s sides run one flash-attn generation with no documented
    mismatch, else the closest pair; None when there is nothing to choose (no GPU, no TE training, a
    rollout neither vLLM nor Megatron generation, or a side with no kernel as configured: ``check``
    reports that). ``invariant_mode``: megatron-core's batch-invariant mode is on."""
    main = plan.main("training")
    rollout_settings = _rollout_side_settings(plan, options, alter_ok, invariant_mode)
    if main is None or not isinstance(main.query, TrainingQuery) or rollout_settings is None:
        return None
    ranked = []
    for training, rollout in itertools.product(_training_settings(main.query, alter_ok), rollout_settings):
        trial = _with(plan, training, rollout, options)
        if not _runs(trial):
            continue
        changes = training.changes + rollout.changes
        alters = any(c.alters_run for c in changes)
        rank = (len(pair_findings(trial)), not one_generation(trial), alters, training.count + rollout.count)
        ranked.append((rank, changes, trial))
    rank, changes, best = min(ranked, key=lambda entry: entry[0])
    trained = best.main("training")
    assert trained is not None  # the same kinds as ``plan``'s
    pair = (trained.kernel.label, " and ".join(dict.fromkeys(k.kernel.label for k in best.rollout)))
    exact = not rank[1]
    return KernelChoice(changes, *pair, exact, None if exact else _split(best, *pair, changes))


def _split(plan: KernelPlan, training: str, rollout: str, changes: tuple[Change, ...]) -> Finding:
    made = f" after {', '.join(f'{c.key}={c.value}' for c in changes)}" if changes else ""
    return finding(
        Code.KERNEL_PAIR_SPLIT,
        "attention_align.preset",
        f"{training} + {rollout}",
        f"on {plan.gpu} no setting makes training and rollout run one flash-attn generation: training runs "
        f"{training} and the rollout {rollout}{made}, the closest pair no host documents as mismatching; the "
        "difference between the two kernels is measured (drift), not removed.",
        "accept the measured drift, or train and roll out on a GPU where the tables give both sides one "
        "flash-attn generation (check --gpu).",
    )


def kernel_step(
    facts: RecipeFacts,
    gpu: str | None,
    environ: Mapping[str, str],
    options: KernelOptions = KernelOptions(),
    alter_ok: bool = False,
) -> KernelChoice | None:
    """``choose`` for a recipe on ``gpu`` (None: no GPU is known, nothing is chosen)."""
    if gpu is None:
        return None
    plan = plan_kernels(facts, gpu, "the preset's GPU", environ, options)
    generation = facts.megatron_generation
    invariant = generation is not None and generation.model.model_overrides.get("batch_invariant_mode") is True
    return choose(plan, options, alter_ok, invariant)
