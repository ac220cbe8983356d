"""Megatron policy worker hook: check before the model config is used, record what really ran.

Seams (NVIDIA-NeMo/RL, read at 7ea279a, v0.7.0, v0.6.0 and v0.5.0):

``setup-module`` layout (>= 0.6.0; main since 5e3f167 "refactor megatron init", 2026-01-22):
  * ``nemo_rl.models.megatron.setup._apply_performance_config(model_cfg, config)``, called through
    the module global by ``setup_model_config``. Before: the pre-flight rules on the worker's own
    policy config (a flash + FP32 config stops here, never reaching TE). After: upstream maps
    ``megatron_cfg.attention_backend`` to ``AttnBackend`` since 21337e5 (#1628, v0.6.0); on the
    commits between the two we apply the same mapping, and never when upstream already did.
  * ``megatron_policy_worker.validate_and_set_config`` (imported by name there, so patched there):
    after it, the model config is finished (``finalize()`` / ``__post_init__`` ran): record it.
  * ``megatron_policy_worker.setup_model_and_optimizer`` (imported by name): after it, the model is
    built and Megatron's ``_set_attention_backend`` has set the NVTE variables: record them and
    read back, after the first forward, what Transformer Engine chose.

``worker-inline`` layout (0.5.x): the model config is built inline in
``MegatronPolicyWorker.__init__`` and ``setup_megatron_model(policy_cfg, cfg, ...)`` (a module
global of ``megatron_policy_worker``) builds the model from ``cfg.model``. There is no
``attention_backend`` key upstream, so the mapping is applied to ``cfg.model`` here, before.

The seams are declared in ``seams.HOOKS``. Any other layout gets one warning naming the NeMo-RL
version and the missing seams and runs untouched; ``attention_align.strict: true`` makes it an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.hosts.seams import Seam
from nemo_rl_attn_align.hosts.worker_records import HostRecord, world_size
from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.worker_ids import training_peers, training_worker_id

if TYPE_CHECKING:
    from nemo_rl_attn_align.contract.megatron_snapshot import ModelConfigSnapshot

log = logging.getLogger("nemo_rl_attn_align")


class TrainingRecord(HostRecord):
    """What this policy worker process learned so far."""

    host = "megatron_worker"

    def __init__(self):
        super().__init__()
        self.plan: Any = None
        self.policy_cfg: dict = {}
        self.snapshot: ModelConfigSnapshot | None = None
        self.observed: dict | None = None
        #: the behaviour fields read from the built model (``megatron_behaviour``), by name
        self.behaviour: dict[str, Any] = {}
        self.nvte: dict[str, str | None] = {}
        self.packed_boundaries: dict | None = None  # hosts.packed_boundaries' statement
        self.layout: str | None = None
        self.backend_mapped_by: str | None = None
        self.rank = int(os.environ.get("RANK", "0") or 0)

    @property
    def worker_id(self) -> str:
        return training_worker_id(self.rank)

    def peers(self) -> list[str]:
        return training_peers(world_size())

    @property
    def generation_only(self) -> bool:
        """A worker of NeMo-RL's dedicated Megatron generation policy: it trains nothing, so it writes
        no training record (its engine writes the rollout one, ``hosts.megatron_generation``)."""
        from nemo_rl_attn_align.hosts.megatron_generation import is_generation_only

        return is_generation_only(self.policy_cfg)

    def write(self, stage: str):
        return None if self.generation_only else super().write(stage)

    def contract(self):
        from nemo_rl_attn_align.contract.training import VERSIONED, training_contract

        return training_contract(
            self.snapshot, self.worker_id, self.observed, versions.library_versions(VERSIONED), self.behaviour
        )

    def detail(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "nemo_rl": versions.installed_version("NeMo-RL"),
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "backend_mapped_by": self.backend_mapped_by,
            "model_config": self.snapshot.to_dict() if self.snapshot is not None else None,
            "nvte_after_build": self.nvte,
            "packed_boundaries": self.packed_boundaries,
            "te_readback": self.observed,
        }


record = TrainingRecord()


#: Codes the host itself raises for, as ``ValueError``, in the very function the ``setup-module``
#: hook wraps (``_apply_performance_config``: "Invalid attention backend: ..."). There the plugin
#: logs its finding (with its suggestion) and lets NeMo-RL raise its own error, so that NeMo-RL's
#: behaviour, and its tests, stay exactly as without the plugin.
HOST_RAISES = {"setup-module": frozenset({Code.ATTN_BACKEND_INVALID.value}), "worker-inline": frozenset()}


def check_policy(policy_cfg: dict, layout: str = "setup-module") -> None:
    """The pre-flight rules on this worker's policy config and environment; errors stop with a
    ``RuleViolation`` (a ``ValueError``, NeMo-RL's type for config errors), except those the host
    raises itself at the same call (``HOST_RAISES``). Nothing is checked where NeMo-RL does not
    enable Megatron (a falsy ``megatron_cfg.enabled``): the host does not use the keys there."""
    from nemo_rl_attn_align.vocab.errors import RuleViolation, UsageError

    plan = record.guarded("checking the policy config", lambda: _plan(policy_cfg), stops=(UsageError,))
    if plan is None or not plan.megatron_enabled:
        return
    left_to_host = [f for f in plan.errors if f.code in HOST_RAISES[layout]]
    for finding in [*plan.warnings, *left_to_host]:
        log.warning("nemo-rl-attn-align: %s", finding.line())
    errors = [f for f in plan.errors if f not in left_to_host]
    if errors:
        raise RuleViolation(errors)


def _plan(policy_cfg: dict) -> Any:
    """The backend plan of this worker's policy config, kept in the record."""
    from nemo_rl_attn_align.preflight.plan import build_plan_for_policy

    plan = build_plan_for_policy(policy_cfg, os.environ)
    record.plan, record.policy_cfg = plan, policy_cfg
    return plan


def _map_backend(model_cfg: Any, mapper: str) -> None:
    """Set ``model_cfg.attention_backend`` to the plan's request (``check_policy`` read it from the
    worker's config), as upstream does since v0.6.0 (only where NeMo-RL enables Megatron; a no-op
    where upstream already mapped it)."""
    from nemo_rl_attn_align.preflight.backend import NVTE_VARIABLES, to_attn_backend

    if record.plan is None or not record.plan.megatron_enabled:
        return
    requested = record.plan.requested
    if requested is None:
        return
    member = to_attn_backend(requested)
    if getattr(model_cfg, "attention_backend", None) == member:
        record.backend_mapped_by = record.backend_mapped_by or "nemo_rl"
        return
    for name in NVTE_VARIABLES:
        os.environ.pop(name, None)
    model_cfg.attention_backend = member
    record.backend_mapped_by = mapper


def _after_model_built(model: Any) -> None:
    """Read what the built model's attention computes, record it with the NVTE variables Megatron
    set, then read back what TE runs at the first forward: each step guarded on its own, so a failed
    step never stops the next."""
    from nemo_rl_attn_align.hosts import packed_boundaries

    record.guarded("reading the attention behaviour", lambda: _read_behaviour(model))
    record.guarded("watching the first packed micro-batch", lambda: packed_boundaries.watch(model, record))
    record.guarded("recording the built model", _record_built_model)
    record.guarded("watching the first forward", lambda: _watch_first_forward(model))


def _read_behaviour(model: Any) -> None:
    """The behaviour fields of the live model (``megatron_behaviour``); a failed read is a note."""
    from nemo_rl_attn_align.hosts import megatron_behaviour

    record.behaviour, problems = megatron_behaviour.read(model)
    for problem in problems:
        record.note(problem)


def _record_built_model() -> None:
    from nemo_rl_attn_align.binding.determinism import probe
    from nemo_rl_attn_align.preflight.backend import NVTE_VARIABLES

    record.nvte = {name: os.environ.get(name) for name in NVTE_VARIABLES}
    expected = dict(record.plan.nvte) if record.plan is not None else {}
    if expected and any(record.nvte.get(k) != v for k, v in expected.items()):
        record.note(f"Megatron set {record.nvte} but the plan expected {expected}")
    record.probe = probe()
    record.write("model_built")
    record.stop_if_strict()


def _watch_first_forward(model: Any) -> None:
    from nemo_rl_attn_align.hosts import te_readback

    def on_first_forward(observed: dict) -> None:
        record.observed = observed
        problem = te_readback.mismatch(record.plan.effective if record.plan else None, observed)
        if problem:
            record.note(problem)
        record.write("first_forward")
        record.stop_if_strict()

    te_readback.attach()
    te_readback.watch_first_forward(model, on_first_forward, record.settings().strict)


def _record_model_config(model_cfg: Any) -> None:
    from nemo_rl_attn_align.contract.megatron_snapshot import read_model_config

    record.snapshot = read_model_config(model_cfg, record.policy_cfg)
    record.write("model_config")


def _wrap_performance_config(original: Callable, seam: Seam) -> Callable:
    def _apply_performance_config(model_cfg, config, *args, **kwargs):
        check_policy(config)
        result = original(model_cfg, config, *args, **kwargs)
        record.guarded("applying attention_backend", lambda: _map_backend(model_cfg, "nemo_rl_attn_align"))
        return result

    return _apply_performance_config


def _wrap_validate_and_set_config(original: Callable, seam: Seam) -> Callable:
    def validate_and_set_config(config, rank, *args, **kwargs):
        record.guarded("reading the worker's rank", lambda: _remember(config, rank))
        runtime_config = original(config, rank, *args, **kwargs)
        record.guarded("recording the model config", lambda: _record_model_config(runtime_config.model_cfg))
        return runtime_config

    return validate_and_set_config


def _remember(config: Any, rank: Any) -> None:
    record.rank = int(rank)
    record.policy_cfg = config if isinstance(config, dict) else record.policy_cfg


def _wrap_setup_model_and_optimizer(original: Callable, seam: Seam) -> Callable:
    def setup_model_and_optimizer(policy_cfg, megatron_cfg, *args, **kwargs):
        state = original(policy_cfg, megatron_cfg, *args, **kwargs)
        record.guarded("reading the built model", lambda: _after_model_built(state.model))
        return state

    return setup_model_and_optimizer


def _wrap_setup_megatron_model(original: Callable, seam: Seam) -> Callable:
    def setup_megatron_model(policy_cfg, cfg, *args, **kwargs):
        check_policy(policy_cfg, "worker-inline")
        record.guarded(
            "applying attention_backend",
            lambda: _map_backend(cfg.model, "nemo_rl_attn_align (NeMo-RL 0.5.x has no attention_backend)"),
        )
        result = original(policy_cfg, cfg, *args, **kwargs)
        record.guarded("recording the model config", lambda: _record_model_config(cfg.model))
        record.guarded("reading the built model", lambda: _after_model_built(result[1]))
        return result

    return setup_megatron_model


def _patch(module) -> None:
    """Wrap the seams of the module that has just been imported; note the layout found."""
    layout = _seams.patch(module)
    if layout is not None:
        record.layout = layout


_seams = hooks.Hook("megatron_worker", _patch)
#: Patch the Megatron worker seams now or when NeMo-RL's modules are imported (idempotent); restore them.
attach, detach = _seams.attach, _seams.detach
