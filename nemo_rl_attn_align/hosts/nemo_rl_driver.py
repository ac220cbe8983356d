"""NeMo-RL driver hook: check the whole config and hand the settings to the workers, before any exist.

Every NeMo-RL algorithm module has ``setup(master_config, ...)`` (``nemo_rl/algorithms/grpo.py``,
``sft.py``, ``dpo.py``, ``distillation.py``, ``rm.py``, ``ppo.py`` at 7ea279a; grpo, sft and dpo
since 0.5.0), called by ``examples/run_<algo>.py`` after the config is loaded and resolved and
before any Ray worker group is built; the scripts import ``setup`` by name *after* the module has
executed, so wrapping the module attribute reaches them. ``master_config`` is a dict (<= 0.6) or a
pydantic ``MasterConfig`` with ``extra="allow"`` (7ea279a), so the top-level ``attention_align:``
block is there either way.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from nemo_rl_attn_align.hosts import _patching, bootstrap, handoff

ALGORITHMS = ("distillation", "dpo", "grpo", "ppo", "rm", "sft")
TARGETS = tuple(f"nemo_rl.algorithms.{name}" for name in ALGORITHMS)
SUPPORTED = {"nemo-rl": ">=0.5.0 (nemo_rl.algorithms.<algorithm>.setup(master_config, ...))"}

log = logging.getLogger("nemo_rl_attn_align")


def as_dict(master_config: Any) -> dict:
    """The master config as a plain dict (pydantic ``MasterConfig`` or dict)."""
    dump = getattr(master_config, "model_dump", None)
    return dump() if callable(dump) else dict(master_config)


def prepare(master_config: Any) -> handoff.WorkerSettings:
    """Run the pre-flight rules on the whole config (errors stop here) and export the worker settings."""
    from nemo_rl_attn_align.plan import build_plan
    from nemo_rl_attn_align.settings import load_settings

    cfg = as_dict(master_config)
    settings = load_settings(cfg)
    plan = build_plan(cfg, os.environ)
    for finding in plan.warnings:
        log.warning("nemo-rl-attn-align: %s", finding.line())
    plan.raise_for_errors()
    worker_settings = handoff.WorkerSettings(strict=settings.strict, on_mismatch=settings.on_mismatch, report_dir=settings.report_dir)
    handoff.export_settings(worker_settings)
    return worker_settings


def _wrap_setup(original: Callable) -> Callable:
    def setup(master_config, *args, **kwargs):
        prepare(master_config)
        return original(master_config, *args, **kwargs)

    return setup


def _patch(module) -> None:
    if not callable(getattr(module, "setup", None)):
        _patching.unsupported("NeMo-RL", getattr(sys.modules.get("nemo_rl"), "__version__", None), f"{module.__name__} has no setup()", handoff.worker_settings().strict)
        return
    _patching.wrap(module, "setup", _wrap_setup)


def attach() -> None:
    """Wrap each algorithm's ``setup`` now or when its module is imported (idempotent)."""
    for name in TARGETS:
        bootstrap.watch(name, _patch)


def detach() -> None:
    """Restore every wrapped ``setup``."""
    for name in TARGETS:
        bootstrap.unwatch(name, _patch)
        module = sys.modules.get(name)
        if module is not None:
            _patching.unwrap(module, "setup")
