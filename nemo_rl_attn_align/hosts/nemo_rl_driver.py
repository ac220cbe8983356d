"""NeMo-RL driver hook: check the config before any worker exists, then keep the run's report.

Seams (NVIDIA-NeMo/RL, read at 7ea279a, v0.7.0, v0.6.0 and v0.5.0; declared in ``seams.HOOKS``):

* ``nemo_rl.algorithms.<algorithm>.setup(master_config, ...)`` (grpo, sft, dpo, distillation, rm;
  ppo and xtoken_off_policy_distillation since 0.7.0), called by ``examples/run_<algo>.py`` after
  the config is resolved and ``logger.log_dir`` moved to ``exp_NNN``, before any Ray worker group
  exists. Before it: the pre-flight rules on the whole config (errors stop here), and the
  ``attention_align`` settings exported for the workers (NeMo-RL copies ``os.environ`` into each
  worker group it creates inside ``setup()``). After it: the first collection of the report (``driver_report``).
* ``nemo_rl.algorithms.single_controller_utils.setup.setup_single_controller(master_config,
  tokenizer, *, ...)`` (7ea279a), which ``examples/run_grpo_single_controller.py`` calls (through the
  package ``single_controller_utils``, which re-exports it) where ``run_grpo.py`` calls ``setup``: the
  same lifecycle, as GRPO; matched by its first two parameters. Its train loop runs inside the
  ``SingleControllerActor`` (a Ray actor), so this driver's last collection is the exit one.
* the train functions (``grpo_train``, ``async_grpo_train``, ``grpo_sync.grpo_train_sync``,
  ``sft_train``, ``dpo_train``, ``distillation_train``, ``rm_train``, ``ppo_train``,
  ``async_ppo_train``, ``xtoken_off_policy_distillation_train``; those a version lacks are
  skipped): the last collection when one returns or raises. An interpreter-exit hook covers
  recipes that train otherwise.
* ``nemo_rl.utils.logger.Logger.log_metrics(self, metrics, step, prefix, ...)``: every train loop
  logs its step metrics through it with ``prefix="train"``; the first with a ``loss`` re-collects
  (the first forward has run), each with drift metrics appends them to the drift log, and the
  first such call of a step then logs the report's numbers under ``attention_align/`` through the
  same Logger's own (unwrapped) ``log_metrics``, at the same step. Nothing is logged at setup:
  a step below a resumed wandb run's current one would be dropped, so the first step carries the
  setup result.

The recipes import these names from the modules *after* the modules executed, so wrapping the
module attributes reaches them. Attaching also puts the plugin's shim on ``PYTHONPATH``
(``bootstrap.export_shim``), the one automatic export: the recipes import the algorithm module at
their top, before ``main()`` calls ``init_ray()`` (``examples/run_grpo.py`` and the other
``run_<algo>.py`` at 7ea279a, v0.7.0, v0.6.0, v0.5.0), which copies ``os.environ`` into the job's
``runtime_env``, and each ``RayWorkerGroup`` copies it again into its actors, so workers in NeMo-RL's
own venvs activate through the shim. ``master_config`` is a dict (<= 0.6) or a pydantic ``MasterConfig``
with ``extra="allow"`` (0.7), so the top-level ``attention_align:`` block is there either way.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.hosts import bootstrap, driver_report, handoff, hooks
from nemo_rl_attn_align.hosts.seams import SINGLE_CONTROLLER, Seam
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.names import BLOCK

if TYPE_CHECKING:
    from nemo_rl_attn_align.config.settings import AlignSettings
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

log = logging.getLogger("nemo_rl_attn_align")


def as_dict(master_config: Any) -> dict:
    """The master config as a plain dict (pydantic ``MasterConfig`` or dict)."""
    dump = getattr(master_config, "model_dump", None)
    return dump() if callable(dump) else dict(master_config)


def prepare(master_config: Any, algorithm: str = "grpo") -> driver_report.RunReport | None:
    """Run the pre-flight rules on the whole config (a bad ``attention_align`` block or a config
    that cannot work stops here), export the worker settings and start this run's report (nothing
    collected yet). None when a step failed otherwise (a failure of the plugin itself, never a
    verdict on the config): one warning and the run goes on, unless strict."""
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.vocab.errors import RuleViolation, UsageError

    settings = _patching.guarded(
        "reading the attention_align settings",
        lambda: load_settings(as_dict(master_config)),
        handoff.worker_settings().strict,
        stops=(UsageError,),
    )
    if settings is None:
        return None
    return _patching.guarded(
        "checking the config before setup()",
        lambda: _check(master_config, settings, algorithm),
        settings.strict,
        stops=(UsageError, RuleViolation),
    )


def _check(master_config: Any, settings: AlignSettings, algorithm: str) -> driver_report.RunReport | None:
    """``prepare``'s pre-flight (its errors stop the run) and the start of the run's report."""
    from nemo_rl_attn_align.preflight.plan import build_plan
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    cfg = as_dict(master_config)
    facts = read_recipe_facts(cfg, os.environ)
    if settings.preset == "aligned":
        preset, facts = apply_preset(master_config, facts, settings)
        cfg = as_dict(master_config)
    else:
        preset = None
    plan = build_plan(facts)
    for finding in plan.warnings:
        log.warning("nemo-rl-attn-align: %s", finding.line())
    plan.raise_for_errors()
    return _patching.guarded(
        "starting the attention report", lambda: _start_run(cfg, facts, settings, algorithm, preset), settings.strict
    )


def apply_preset(master_config: Any, facts: RecipeFacts, settings: AlignSettings) -> tuple[dict, RecipeFacts]:
    """``attention_align.preset: aligned``: write the settings that align both sides into the master
    config before any worker group exists (NeMo-RL builds every worker's environment from it), log
    each change and, where a cause needs a layout change, the one finding that says so. Returns the
    alignment (``preset.Alignment.to_dict()``) for the report, and the aligned config's facts."""
    from nemo_rl_attn_align.aligning.preset import align, apply_changes
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    kernels, no_kernels = _kernel_step()
    alignment = align(
        as_dict(master_config),
        lambda config: read_recipe_facts(config, os.environ, facts.files),
        lambda recipe: preview_binding(recipe, settings, os.environ),
        kernels=kernels,
    )
    apply_changes(master_config, alignment.changes)
    for change in alignment.changes:
        log.warning("nemo-rl-attn-align: preset aligned sets %s=%r (%s)", change.key, change.value, change.reason)
    if alignment.refusal is not None:
        log.warning("nemo-rl-attn-align: preset aligned: %s", alignment.refusal.line())
    if alignment.kernels is not None and alignment.kernels.finding is not None:
        log.warning("nemo-rl-attn-align: preset aligned: %s", alignment.kernels.finding.line())
    if no_kernels is not None:
        log.warning("nemo-rl-attn-align: preset aligned chooses no kernels: %s", no_kernels)
    return alignment.to_dict(), alignment.facts


def _kernel_step() -> tuple[Any, str | None]:
    """The preset's kernel step on this (the driver's) node's GPU, for the vLLM installed here, or why
    there is none: the step writes vLLM engine arguments only for a vLLM version the tables hold
    (``attention_config`` does not exist in every vLLM NeMo-RL pins)."""
    from nemo_rl_attn_align.kernels.gpu import local_gpu
    from nemo_rl_attn_align.kernels.kernel_choice import kernel_step
    from nemo_rl_attn_align.kernels.kernel_prediction import installed_table_version
    from nemo_rl_attn_align.kernels.kernel_query import KernelOptions

    gpu, why = local_gpu()
    if gpu is None:
        return None, why
    installed = installed_table_version("rollout")
    if installed is None:
        return None, (
            "the driver's environment has no vLLM whose selector the tables hold; "
            f"check --gpu {gpu} --vllm VERSION --fix prints the kernel settings for the workers' vLLM"
        )
    options = KernelOptions(vllm=installed[0])
    return functools.partial(kernel_step, gpu=gpu, environ=os.environ, options=options), None


def _start_run(
    cfg: dict, facts: RecipeFacts, settings: AlignSettings, algorithm: str, preset: dict | None = None
) -> driver_report.RunReport:
    run_id = uuid.uuid4().hex
    # Absolute: Ray workers do not run in the driver's working directory.
    report_dir = os.path.abspath(driver_report.report_dir_for(cfg, settings.report_dir))
    handoff.export_settings(handoff.WorkerSettings(strict=settings.strict, report_dir=report_dir, run_id=run_id))
    effective = handoff.worker_settings()  # the launcher's variables win, in every worker and here
    settings = settings.replace(strict=effective.strict, report_dir=effective.report_dir)
    from nemo_rl_attn_align.preflight.expected_workers import expected_workers
    from nemo_rl_attn_align.report.document import RunDescription

    absent = driver_report.absent_sides(cfg, facts, algorithm)
    run = RunDescription(run_id, expected=expected_workers(cfg, absent), absent_sides=absent, preset=preset)
    report = driver_report.RunReport(settings, run, estimate=functools.partial(_attention_estimate, facts))
    return driver_report.start(report)


def _attention_estimate(facts: RecipeFacts, reported: driver_report.ReportedGpu | None) -> dict:
    """The estimate on the GPU the workers recorded, else the driver node's."""
    from nemo_rl_attn_align.drift.estimate import attention_only_estimate

    if reported is None:
        return attention_only_estimate(facts)
    estimate = attention_only_estimate(facts, gpu=reported[0])
    return {**estimate, "assumes": [f"GPU {reported[0]}: {reported[1]}", *estimate.get("assumes", [])]}


def _wrap_setup(original: Callable, seam: Seam) -> Callable:
    # GRPO's single-controller setup, else nemo_rl.algorithms.<algorithm>.setup
    algorithm = "grpo" if seam.module.startswith(SINGLE_CONTROLLER) else seam.module.rsplit(".", 1)[1]

    def setup(master_config, *args, **kwargs):
        run = prepare(master_config, algorithm)
        try:
            result = original(master_config, *args, **kwargs)
        except BaseException:
            if run is not None:
                run.at_end("setup_failed")
            raise
        if run is not None:
            run.at_setup()
        return result

    return setup


def _wrap_train(original: Callable, seam: Seam) -> Callable:
    def train(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            driver_report.end_of_training()

    return train


def _wrap_log_metrics(original: Callable, seam: Seam) -> Callable:
    def log_metrics(self, metrics, step, *args, **kwargs):
        result = original(self, metrics, step, *args, **kwargs)
        prefix = kwargs.get("prefix", args[0] if args else "")

        def tracker(numbers: dict[str, float]) -> None:  # the Logger's own method: never back into ours
            original(self, numbers, step, prefix=BLOCK)

        driver_report.train_metrics(metrics, step, prefix, tracker)
        return result

    return log_metrics


_seams = hooks.Hook("nemo_rl_driver")
#: Whether attaching put the shim on PYTHONPATH (None: not attached since the last detach).
_exported_shim: bool | None = None


def attach() -> None:
    """Export the shim for the workers (once), then wrap each algorithm's ``setup`` and train
    functions and ``Logger.log_metrics`` now or when their modules are imported (idempotent)."""
    global _exported_shim
    if _exported_shim is None and bootstrap.enabled():
        _exported_shim = bootstrap.export_shim(os.environ)
    _seams.attach()


def detach() -> None:
    """Restore everything wrapped (and ``PYTHONPATH``, if attaching exported the shim) and forget
    the current run report."""
    global _exported_shim
    _seams.detach()
    if _exported_shim:
        bootstrap.withdraw_shim(os.environ)
    _exported_shim = None
    driver_report.stop()
