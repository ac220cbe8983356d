"""From finding mismatches to removing them: ``attention_align.preset: aligned`` and ``check --fix``.

``align(cfg)`` previews the binding, and while its semantic or determinism tier fails it applies the
setting that removes the first cause, then previews again. What each cause takes:

* rollout ``reduction_order: split_kv`` (vLLM's decode may split the KV): vLLM's batch-invariant
  mode, ``VLLM_BATCH_INVARIANT=1`` in ``policy.generation.vllm_cfg.env_vars`` (one KV split); with
  Megatron generation, megatron-core's batch-invariant mode (``model_overrides``, a change to both
  sides' kernels: ``check --fix`` only);
* ``CUBLAS_WORKSPACE_CONFIG`` meaning differs: Megatron's deterministic workspace ``:4096:8`` on the
  side that lacks one (vLLM's batch-invariant mode sets ``:4096:8`` or ``:16:8``, the same meaning);
* ``dtype``: a rollout precision other than ``policy.precision`` (an FP8 rollout, say) is a choice:
  the preset refuses, ``--fix`` sets ``policy.generation.vllm_cfg.precision`` to ``policy.precision``;
* training ``reduction_order: ring_step`` / ``downcast: per_partial`` (context parallelism): NeMo-RL
  packs sequences whenever ``context_parallel_size > 1`` and Transformer Engine runs packed (``thd``,
  padding masks) attention only over its p2p ring (``AttnFuncWithCPAndQKVOA2A`` and
  ``AttnFuncWithCPAndKVAllGather`` assert no padding mask); only ``context_parallel_size: 1`` aligns;
* ``NCCL_ALGO`` / ``NCCL_PROTO`` (tensor parallelism > 1): vLLM's batch-invariant mode pins the
  allreduce to Tree/Simple while Megatron's deterministic mode requires Ring: only TP 1 aligns.

The preset (run by the driver before any worker starts, and shown by ``check``) applies only
determinism settings (environment variables); a cause that needs the parallel layout or the rollout
precision changed is refused with one finding. ``check --fix`` may also change those, each such
change labelled with its cost, and prints the smallest set of Hydra overrides that turns the preview
to pass. Both also name what no tier demands but a recorded difference calls for (``recommended``):
``apply_rope_fusion: false`` where the two sides' RoPE differ only by training's fused kernel.
Stdlib only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.binding.binding import Status
from nemo_rl_attn_align.vocab.change import Change
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding
from nemo_rl_attn_align.vocab.schema import Tier, field_spec

if TYPE_CHECKING:
    from nemo_rl_attn_align.kernels.kernel_choice import KernelChoice
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

#: Megatron's deterministic-mode cuBLAS workspace; vLLM's batch-invariant ``:16:8`` means the same.
CUBLAS_DETERMINISTIC = ":4096:8"
_VLLM_ENV = "policy.generation.vllm_cfg.env_vars"
#: NeMo-RL's switch for Transformer Engine's fused RoPE kernel in training (its default: true).
ROPE_FUSION_KEY = "policy.megatron_cfg.apply_rope_fusion"
#: The fields that say what RoPE each side computes, beside the fusion.
_ROPE_FIELDS = ("rope", "rope_type", "rope_parameters")
_MEGATRON_ENV = "policy.megatron_cfg.env_vars"
#: How many preview rounds ``align`` runs at most (each removes at least one cause).
MAX_ROUNDS = 6


#: What removes one cause: the changes, or the finding that says why the preset makes none.
Remedy = list[Change] | Finding


@dataclass(frozen=True)
class Alignment:
    """What ``align`` did: the changes, the preview after them, why it stopped short (``None`` when
    the semantic and determinism tiers pass, or when the config has no two sides to bind), the
    changed config and its facts, and the kernel step's choice (``kernel_choice``; None: no GPU to
    choose for). ``recommended``: what the preview calls for beyond the tiers (``recommended``),
    named, never applied."""

    changes: tuple[Change, ...]
    preview: Any  # preview.BindingPreview after the changes
    refusal: Finding | None
    config: Mapping[str, Any]  # a copy of the config with the changes applied
    facts: RecipeFacts  # ``config`` read
    kernels: KernelChoice | None = None

    @property
    def aligned(self) -> bool:
        return self.refusal is None and self.preview.binding is not None

    @property
    def recommended(self) -> tuple[Change, ...]:
        return recommended(self.preview)

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "aligned": self.aligned,
            "refusal": self.refusal.to_dict() if self.refusal else None,
            "kernels": self.kernels.to_dict() if self.kernels else None,
            "recommended": [c.to_dict() for c in self.recommended],
        }


def get_key(cfg: Mapping[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def blocked_parent(cfg: Mapping[str, Any], key: str) -> tuple[str, Any] | None:
    """``(dotted parent, its value)`` when a parent of ``key`` is set but is not a mapping (so
    ``set_key`` cannot create ``key`` under it), else None."""
    node: Any = cfg
    parents = key.split(".")[:-1]
    for depth, part in enumerate(parents, 1):
        node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return None
        if not isinstance(node, Mapping):
            return ".".join(parents[:depth]), node
    return None


def set_key(cfg: Any, key: str, value: Any) -> None:
    """Set dotted ``key`` in a nested dict (a pydantic model's attributes too), creating mappings
    where the path is missing or null (NeMo-RL's recipes write ``env_vars: null``)."""
    *parents, last = key.split(".")
    node = cfg
    for part in parents:
        child = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
        if child is None:
            child = {}
            if isinstance(node, dict):
                node[part] = child
            else:
                setattr(node, part, child)
        elif not isinstance(child, Mapping):
            raise ValueError(f"{key}: {part}={child!r} is not a mapping; cannot set {last} under it")
        node = child
    if isinstance(node, dict):
        node[last] = value
    else:
        setattr(node, last, value)


def blocking_causes(preview: Any) -> list[tuple[str, str, Any]]:
    """What fails the semantic and determinism tiers: ``(kind, name, result)`` for each mismatching
    semantic field (kind ``field``) and blocking determinism variable (kind ``determinism``)."""
    binding = preview.binding
    if binding is None:
        return []
    causes: list[tuple[str, str, Any]] = [
        ("field", r.name, r) for r in binding.with_status(Status.MISMATCH) if r.tier is Tier.SEMANTIC
    ]
    if binding.determinism is not None:
        causes += [("determinism", e.name, e) for e in binding.determinism.entries if e.blocking]
    return causes


def recommended(preview: Any) -> tuple[Change, ...]:
    """What no tier demands but the preview's recorded differences call for: unfused RoPE in training
    where training runs Transformer Engine's fused RoPE kernel, the rollout does not, and nothing else
    about RoPE differs (the measured ``rope``, where known, and the configuration read). Fused and
    unfused RoPE round differently in bf16: NeMo-RL #1801 saw ``token_mult_prob_error`` spike on every
    step with fusion on (with bias-activation fusion), on 6.4% of steps with both off."""
    binding = preview.binding
    if binding is None:
        return ()
    fusion = binding.result("rope_fusion")
    if fusion.status is not Status.DIFFERENT or fusion.training.value is not True or fusion.rollout.value is True:
        return ()
    if any(binding.result(name).status is Status.MISMATCH for name in _ROPE_FIELDS):
        return ()
    reason = (
        "training applies RoPE with Transformer Engine's fused kernel, the rollout with its own: they round "
        "differently in bf16 (NeMo-RL #1801: token_mult_prob_error spiked on every step with fusion on); unfused "
        "RoPE costs a little training speed; `nemo-rl-attn-align probe CONFIG` measures RoPE's share of the "
        "logprob difference"
    )
    return (Change(ROPE_FUSION_KEY, False, reason, alters_run=True),)


def _refuse(where: str, value: Any, message: str, fix: str) -> Finding:
    return finding(Code.ALIGN_PRESET_REFUSED, where, repr(value), message, fix)


def _remedy(kind: str, name: str, result: Any, cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """The changes that remove one cause (``blocking_causes``), or the finding that says why none
    keeps the layout: a semantic field's remedy, or a determinism variable's."""
    if kind == "field":
        return _field_remedy(name, result.training.value, result.rollout.value, cfg, alter_ok)
    return _determinism_remedy(name, result, cfg, alter_ok)


def _altering(alter_ok: bool, changes: list[Change], refusal: Finding) -> Remedy:
    """``changes`` that alter the run (layout, rollout precision): ``check --fix`` makes them, the
    preset refuses with ``refusal``."""
    return changes if alter_ok else refusal


def _field_remedy(name: str, t: Any, r: Any, cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """A semantic field with training value ``t`` and rollout value ``r``."""
    if name == "reduction_order" and r == "split_kv" and get_key(cfg, "policy.generation.backend") == "megatron":
        return _megatron_invariant_remedy(cfg, alter_ok)
    if name == "reduction_order" and r == "split_kv":
        return [
            Change(
                f"{_VLLM_ENV}.VLLM_BATCH_INVARIANT",
                "1",
                "vLLM batch-invariant mode: one KV split, tiles folded in KV order",
            )
        ]
    if name == "dtype":
        return _dtype_remedy(t, r, cfg, alter_ok)
    if name in ("reduction_order", "downcast") and t in ("ring_step", "per_partial"):
        return _context_parallel_remedy(name, cfg, alter_ok)
    return _refuse(
        f"contract.semantic.{name}",
        {"training": t, "rollout": r},
        f"{name}: training {t!r}, rollout {r!r}: no setting the preset makes changes it",
        field_spec(name).fix,
    )


def _dtype_remedy(t: Any, r: Any, cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """A rollout precision other than the training's: a choice, changed only by ``check --fix``."""
    change = Change(
        "policy.generation.vllm_cfg.precision",
        get_key(cfg, "policy.precision"),
        "the rollout runs the training precision (a deliberate low-precision rollout loses its speed-up)",
        alters_run=True,
    )
    refusal = _refuse(
        "policy.generation.vllm_cfg.precision",
        r,
        f"dtype: the rollout runs {r!r}, the training {t!r}: a rollout precision is a choice "
        "the preset does not override",
        "set policy.generation.vllm_cfg.precision to policy.precision (check --fix), or "
        "attention_align.allow_dtype_difference: true to measure the difference",
    )
    return _altering(alter_ok, [change], refusal)


def _megatron_invariant_remedy(cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """Megatron generation's split-KV decode: megatron-core's batch-invariant mode (one split), which
    needs flash attention and a pinned FlashAttention 3 or 4 on both sides: a slower mode of both."""
    overrides = "policy.megatron_cfg.model_overrides"
    why = "megatron-core batch-invariant mode: num_splits=1 in generation, the same FlashAttention kernel in training"
    changes = [
        Change("policy.megatron_cfg.attention_backend", "flash", why, alters_run=True),
        Change(f"{overrides}.batch_invariant_mode", True, why, alters_run=True),
        Change(f"{overrides}.flash_attention_version", 3, why + " (3: Hopper; use 4 on Blackwell)", alters_run=True),
        Change(
            f"{overrides}.attention_dropout", 0.0, "batch-invariant mode refuses attention dropout", alters_run=True
        ),
    ]
    refusal = _refuse(
        f"{overrides}.batch_invariant_mode",
        get_key(cfg, f"{overrides}.batch_invariant_mode"),
        "reduction_order: Megatron generation lets flash-attn split the KV (num_splits=0); one split takes "
        "megatron-core's batch-invariant mode, which changes both sides' kernels",
        f"set {overrides}.batch_invariant_mode=true with attention_backend=flash and "
        f"{overrides}.flash_attention_version=3 or 4 (check --fix), or relax attention_align.mandate.reduction_order",
    )
    return _altering(alter_ok, changes, refusal)


def _context_parallel_remedy(name: str, cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """Training's ring-step merge under context parallelism: only ``context_parallel_size: 1`` aligns."""
    cp = get_key(cfg, "policy.megatron_cfg.context_parallel_size")
    change = Change(
        "policy.megatron_cfg.context_parallel_size",
        1,
        "no context parallelism: one kernel pass over the KV; each GPU then holds "
        "whole sequences (more activation memory)",
        alters_run=True,
    )
    refusal = _refuse(
        "policy.megatron_cfg.context_parallel_size",
        cp,
        f"context_parallel_size {cp}: NeMo-RL packs sequences under context parallelism and "
        "Transformer Engine runs packed attention only over its p2p ring, whose merge order "
        "depends on rank and cp_size (a2a and all_gather reject packed masks)",
        "set policy.megatron_cfg.context_parallel_size=1, or relax "
        f"attention_align.mandate.{name} (the drift is then measured, not removed)",
    )
    return _altering(alter_ok, [change], refusal)


def _determinism_remedy(name: str, result: Any, cfg: Mapping[str, Any], alter_ok: bool) -> Remedy:
    """A blocking determinism variable: the cuBLAS workspace is set where it lacks the deterministic
    meaning; ``NCCL_ALGO`` / ``NCCL_PROTO`` align only without tensor parallelism."""
    if name == "CUBLAS_WORKSPACE_CONFIG":
        side = _MEGATRON_ENV if result.training_meaning.value != "deterministic" else _VLLM_ENV
        return [
            Change(
                f"{side}.CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC, "deterministic cuBLAS workspace on both sides"
            )
        ]
    changes = [
        Change(
            "policy.megatron_cfg.tensor_model_parallel_size",
            1,
            "no tensor parallelism in training: no allreduce reduces the compared tensor "
            "(each GPU holds the whole model)",
            alters_run=True,
        ),
        Change(
            "policy.generation.vllm_cfg.tensor_parallel_size",
            1,
            "no tensor parallelism in rollout (each GPU holds the whole model)",
            alters_run=True,
        ),
    ]
    tp = {
        "training": get_key(cfg, "policy.megatron_cfg.tensor_model_parallel_size"),
        "rollout": get_key(cfg, "policy.generation.vllm_cfg.tensor_parallel_size"),
    }
    refusal = _refuse(
        "policy.megatron_cfg.tensor_model_parallel_size",
        tp,
        f"{name}: with tensor parallelism the allreduce must run one NCCL algorithm on both sides, "
        "but vLLM's batch-invariant mode pins it to Tree/Simple and Megatron's deterministic mode "
        "requires Ring",
        "run tensor_model_parallel_size=1 and vllm_cfg.tensor_parallel_size=1, or accept the "
        "measured allreduce drift (attention_align.on_mismatch: warn)",
    )
    return _altering(alter_ok, changes, refusal)


def align(
    cfg: Mapping[str, Any],
    read: Callable[[Mapping[str, Any]], RecipeFacts],
    preview_of: Callable[[RecipeFacts], Any],
    *,
    alter_ok: bool = False,
    kernels: Callable[[RecipeFacts], KernelChoice | None] | None = None,
) -> Alignment:
    """Apply the settings that make the semantic and determinism tiers of ``preview_of(read(cfg))``
    pass, then the kernel choice (``kernel_choice.kernel_step`` on the GPU known; None: no kernel step).

    ``read`` reads a config's facts (once per round); ``preview_of`` previews them
    (``binding_preview.preview_binding`` with fixed settings and environment). ``alter_ok`` lets parallel
    sizes change (``check --fix``); the preset keeps them. ``cfg`` is not modified: the changes are
    applied to a copy.
    """
    work = copy.deepcopy(dict(cfg))
    changes: list[Change] = []
    refusals: dict[str, Finding] = {}  # by key: NCCL_ALGO and NCCL_PROTO share one cause
    facts = read(work)
    preview = preview_of(facts)
    for _ in range(MAX_ROUNDS):
        fresh: list[Change] = []
        for kind, name, result in blocking_causes(preview):
            remedy = _remedy(kind, name, result, work, alter_ok)
            if isinstance(remedy, Finding):
                refusals.setdefault(remedy.key, remedy)
                continue
            for change in remedy:
                blocked = blocked_parent(work, change.key)
                if blocked is not None:
                    refusals.setdefault(
                        blocked[0],
                        _refuse(
                            blocked[0],
                            blocked[1],
                            f"{blocked[0]} is not a mapping: the preset cannot set "
                            f"{change.key.rsplit('.', 1)[1]} under it",
                            f"make {blocked[0]} a mapping (or null)",
                        ),
                    )
                elif get_key(work, change.key) != change.value and change not in fresh:
                    fresh.append(change)
        if not fresh:
            break
        for change in fresh:
            set_key(work, change.key, change.value)
        changes.extend(fresh)
        facts = read(work)
        preview = preview_of(facts)
    left = blocking_causes(preview)
    if not left:
        return _with_kernels(Alignment(tuple(changes), preview, None, work, facts), read, preview_of, kernels)
    refusal = next(iter(refusals.values()), None) or _refuse(
        left[0][1],
        None,
        f"{left[0][1]} still fails after {', '.join(c.key for c in changes) or 'no change'}",
        "report this as a bug of nemo-rl-attn-align",
    )
    return Alignment(tuple(changes), preview, refusal, work, facts)


def _with_kernels(
    alignment: Alignment,
    read: Callable[[Mapping[str, Any]], RecipeFacts],
    preview_of: Callable[[RecipeFacts], Any],
    kernels: Callable[[RecipeFacts], KernelChoice | None] | None,
) -> Alignment:
    """``alignment`` (whose tiers pass) with the kernel step's choice applied and previewed again."""
    work, facts, preview = alignment.config, alignment.facts, alignment.preview
    choice = kernels(facts) if kernels is not None else None
    applied = tuple(c for c in choice.changes if blocked_parent(work, c.key) is None) if choice else ()
    for change in applied:
        set_key(work, change.key, change.value)
    if applied:
        facts = read(work)
        preview = preview_of(facts)
    return Alignment(alignment.changes + applied, preview, None, work, facts, choice)


def apply_changes(master_config: Any, changes: tuple[Change, ...]) -> None:
    """Write ``changes`` into the driver's master config (a dict or NeMo-RL 0.7's pydantic model)."""
    for change in changes:
        set_key(master_config, change.key, change.value)
