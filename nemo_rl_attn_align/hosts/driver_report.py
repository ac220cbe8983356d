"""The driver's one run report: collected when ``setup()`` returned, after the first training step
and at the end of training, always into the same file.

Collection points (the report's ``collected_at``; ``report.finalize`` does each):

* ``setup``: NeMo-RL's ``setup()`` blocks on its worker groups before it returns (the policy's and
  the vLLM generation's actors build their engines in their constructors, and ``setup()`` calls
  them), so every worker has written its ``model_config`` / ``model_built`` / ``engine_ready``
  record ("step 0"). The human summary is printed here, once. A failed tier whose ``on_mismatch``
  is ``error`` (by default: identity, e.g. the two sides' modules compute a different RoPE or mask)
  stops the run here with ``AttentionMismatch``, after the report is written; ``warn`` prints and
  goes on; ``record`` prints one line with the report's path.
* ``setup_failed``: ``setup()`` raised (a worker died, a config error of NeMo-RL's): what the
  workers recorded is written, one line is printed, and NeMo-RL's error propagates unchanged.
* ``first_step``: the first ``Logger.log_metrics(metrics, step, prefix="train")`` whose metrics hold
  a training ``loss``: the policy workers have run their first forward, so Transformer Engine's
  read-back (stage ``first_forward``) and any read-back mismatch are in. Printed only when something
  changed; a failed tier whose ``on_mismatch`` is ``error`` stops the run here too when the
  read-back turned the verdict to ``fail``.
* every ``train`` metrics call carrying NeMo-RL's drift metrics (``token_mult_prob_error``,
  ``gen_kl_error``, ``policy_kl_error``, ``js_divergence_error``): the figures are appended to
  the run's drift log (``report.drift_log``; one line, the report is not rewritten, nothing
  printed); every collection and ``report`` take ``drift.steps`` from it.
* ``train_end`` when the algorithm's train function returns or raises; ``exit`` at interpreter exit
  when no train function this plugin knows ran: the last collection, one line, never raises.

A failure of this code itself is one warning and the run goes on (``attention_align.strict: true``
makes it stop the run, except at the end).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import math
import operator
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.names import BLOCK, NEMO_RL_DRIFT_METRICS

if TYPE_CHECKING:
    from nemo_rl_attn_align.config.settings import AlignSettings
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
    from nemo_rl_attn_align.report.document import RunDescription

log = logging.getLogger("nemo_rl_attn_align")

#: Algorithms that train on a fixed dataset: they start no generation workers (off-policy
#: distillation scores a fixed dataset with the student and its teachers).
NO_ROLLOUT = ("dpo", "rm", "sft", "xtoken_off_policy_distillation")

_EXPERIMENT_DIR = re.compile(r"exp_\d+")
_print = functools.partial(print, flush=True)


def report_dir_for(cfg: Mapping[str, Any], report_dir: str) -> str:
    """Where this run's report goes, given the resolved ``attention_align.report_dir``.

    NeMo-RL's recipes move ``logger.log_dir`` into a fresh ``exp_NNN`` subdirectory
    (``get_next_experiment_dir``) after the config was resolved and before ``setup()``. The default
    report dir is derived from the moved value already. An explicit ``report_dir`` inside the parent
    of ``exp_NNN`` but in no ``exp_*`` directory -- what ``${logger.log_dir}/...`` resolved to before
    the move -- moves with it; any other explicit path is kept.
    """
    from nemo_rl_attn_align.config.loader import get_path

    block = cfg.get(BLOCK)
    log_dir = get_path(cfg, "logger.log_dir", None)
    if not isinstance(block, Mapping) or "report_dir" not in block or not isinstance(log_dir, str):
        return report_dir
    run_dir = os.path.abspath(log_dir)
    if not _EXPERIMENT_DIR.fullmatch(os.path.basename(run_dir)):
        return report_dir
    try:
        relative = os.path.relpath(os.path.abspath(report_dir), os.path.dirname(run_dir))
    except ValueError:  # another drive
        return report_dir
    first = relative.split(os.sep)[0]
    if first == os.pardir or _EXPERIMENT_DIR.fullmatch(first):
        return report_dir
    return os.path.normpath(os.path.join(log_dir, relative))


def absent_sides(cfg: Mapping[str, Any], facts: RecipeFacts, algorithm: str) -> dict[str, str]:
    """The sides this run has no workers for (``facts``: ``cfg`` read), with the reason the report states."""
    from nemo_rl_attn_align.contract.contract_preview import absent_sides as absent_in_config
    from nemo_rl_attn_align.preflight.expected_workers import generation_gpus
    from nemo_rl_attn_align.vocab.schema import NotBound

    sides = absent_in_config(facts)
    if algorithm in NO_ROLLOUT:
        sides["rollout"] = f"{algorithm} trains on a fixed dataset and starts no generation workers"
    elif isinstance(sides.get("rollout"), NotBound):
        gpus, how = generation_gpus(cfg)
        count = f"{gpus} generation GPUs" if gpus else "its generation workers"
        sides["rollout"] = NotBound(f"{sides['rollout']}; {count} ({how}) run unrecorded")
    return sides


def drift_figures(metrics: Mapping[str, Any]) -> dict[str, float]:
    """NeMo-RL's drift metrics among ``metrics`` that are one finite number each."""
    figures = {}
    for name in NEMO_RL_DRIFT_METRICS:
        value = metrics.get(name)
        if value is None or isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):  # a per-sample list or tensor: not a step figure
            continue
        if math.isfinite(number):
            figures[name] = number
    return figures


#: The GPU this run's workers record, and how many of them: ``("sm90", "recorded by 8 of 8 workers")``.
ReportedGpu = tuple[str, str]


def reported_gpu(report_dir: str, run_id: str | None) -> ReportedGpu | None:
    """The GPU most of this run's workers record in their contracts (``gpu``, from torch.cuda), and
    how many do; None when none records one (no worker has written, or none runs on CUDA)."""
    from collections import Counter

    from nemo_rl_attn_align.report.store import read_worker_files

    records = read_worker_files(report_dir, run_id).records
    seen = Counter(r.contract.fields["gpu"].value for r in records if r.contract.fields["gpu"].value)
    if not seen:
        return None
    gpu, count = seen.most_common(1)[0]
    return str(gpu), f"recorded by {count} of {len(records)} workers (torch.cuda)"


class RunReport:
    """The report of one run of an algorithm, from ``setup()`` to the end of training."""

    def __init__(
        self,
        settings: AlignSettings,
        run: RunDescription,
        *,
        printer: Callable[[str], None] = _print,
        estimate: Callable[[ReportedGpu | None], Mapping[str, Any]] | None = None,
    ):
        self.settings = settings  # with the run's real report_dir
        self.run = run  # its ``attention_only`` is filled in at setup
        self.printer = printer
        self.doc: dict[str, Any] | None = None
        self.finished = False
        self.stepped = False
        #: makes the attention-only drift estimate (``drift.estimate``) once, at setup, on the GPU the
        #: workers recorded (``reported_gpu``; None: none did)
        self.estimate = estimate
        self.logged_step: int | None = None
        self._lock = threading.RLock()

    def _collect(self, point: str, *, enforce: bool, final: bool = False) -> None:
        from nemo_rl_attn_align.report.finalize import AttentionMismatch, Collection, finalize, raise_for_mismatch

        at = Collection(point, previous=self.doc, final=final)
        self.doc = finalize(self.settings, self.run, at, printer=self.printer, enforce=False)
        if enforce:
            self._stop_if_unrecorded(self.doc)
            try:
                raise_for_mismatch(self.doc)
            except AttentionMismatch:
                self.finished = True  # the run stops: nothing more to collect
                raise

    def _stop_if_unrecorded(self, doc: Mapping[str, Any]) -> None:
        """Strict mode: a side with 0 of N workers recorded, or a rollout side no hook can record,
        stops the run (after the report is written)."""
        from nemo_rl_attn_align.vocab.codes import Code

        stopping = (Code.REPORT_SIDE_MISSING.value, Code.REPORT_ROLLOUT_NOT_BOUND.value)
        unrecorded = [f["message"] for f in doc["findings"] if f["code"] in stopping and f["severity"] == "error"]
        if unrecorded:
            self.finished = True
            raise _patching.StrictModeError(
                "; ".join(unrecorded) + ". attention_align.strict is true, so the run stops."
            )

    def _guarded(self, what: str, action: Callable[[], None], strict: bool) -> None:
        _patching.guarded(f"{what} (report dir {self.settings.report_dir})", action, strict)

    def _estimate_attention_drift(self) -> None:
        if self.estimate is not None and self.settings.attention_estimate:
            estimate = self.estimate(reported_gpu(self.settings.report_dir, self.run.run_id))
            self.run = dataclasses.replace(self.run, attention_only=dict(estimate))

    def at_setup(self) -> None:
        """``setup()`` returned: estimate attention's drift, collect, print the summary, enforce
        ``on_mismatch``."""
        with self._lock:
            self._guarded(
                "estimating the drift attention alone adds", self._estimate_attention_drift, self.settings.strict
            )
            self._guarded(
                "collecting the attention report after setup()",
                lambda: self._collect("setup", enforce=True),
                self.settings.strict,
            )

    def at_train_metrics(
        self, metrics: Any, step: Any, prefix: Any, tracker: Callable[[dict[str, float]], None] | None = None
    ) -> None:
        """A ``Logger.log_metrics`` call: the first training step re-collects; drift is recorded;
        a training step's call (one with a ``loss`` or drift figures) then logs the report's
        numbers once per step through ``tracker`` (the Logger's own, unwrapped ``log_metrics``)."""
        if prefix != "train" or not isinstance(metrics, Mapping):
            return
        figures = self._step_metrics(metrics, step)
        if tracker is not None and self.settings.log_metrics and ("loss" in metrics or figures):
            self._guarded(
                "logging attention_align metrics", lambda: self._log_tracker(step, tracker), self.settings.strict
            )

    def _log_tracker(self, step: Any, tracker: Callable[[dict[str, float]], None]) -> None:
        from nemo_rl_attn_align.report.tracker_metrics import tracker_metrics

        with self._lock:
            if self.doc is None or self.finished or step == self.logged_step:
                return
            self.logged_step = step
            numbers = tracker_metrics(self.doc)
        tracker(numbers)

    def _step_metrics(self, metrics: Mapping[str, Any], step: Any) -> dict[str, float]:
        """The first-step collection and the step's drift figures (returned, for the tracker)."""
        with self._lock:
            if self.finished:
                return {}
            if not self.stepped and "loss" in metrics:
                self.stepped = True
                self._guarded(
                    "collecting the attention report after the first training step",
                    lambda: self._collect("first_step", enforce=True),
                    self.settings.strict,
                )
            figures = drift_figures(metrics)
            if figures and self.doc is not None and not self.finished:
                self._guarded(
                    "recording drift metrics",
                    lambda: self._record_drift(operator.index(step), figures),
                    self.settings.strict,
                )
            return figures

    def _record_drift(self, step: int, figures: Mapping[str, float]) -> None:
        """Append the step's figures to the drift log (the report takes them at its next collection)."""
        from nemo_rl_attn_align.report.document import drift_entry
        from nemo_rl_attn_align.report.drift_log import append_step, drift_log_path

        append_step(drift_log_path(self.settings.report_dir, self.run.run_id), drift_entry(step, figures))

    def at_end(self, point: str) -> None:
        """The last collection (``train_end``, ``exit``, ``setup_failed``, ...): once, one line, never
        raises. Then the temp files of writers killed mid-write (listed in the report as incomplete
        writes) are removed."""
        from nemo_rl_attn_align.report.store import remove_stale_temp_files

        with self._lock:
            if self.finished:
                return
            self.finished = True
            self._guarded(
                f"collecting the attention report at {point}",
                lambda: self._collect(point, enforce=False, final=True),
                strict=False,
            )
            remove_stale_temp_files(self.settings.report_dir)


#: The run report of this driver process (None before the first ``setup()``).
current: RunReport | None = None
_exit_hook = False


def start(run: RunReport) -> RunReport:
    """Make ``run`` this process's run report (a previous one ends here); collect it at exit."""
    global current, _exit_hook
    if current is not None:
        current.at_end("next_setup")
    current = run
    if not _exit_hook:
        atexit.register(_at_exit)
        _exit_hook = True
    return run


def stop() -> None:
    """Forget the current run report without collecting it (``detach()``, tests)."""
    global current, _exit_hook
    current = None
    if _exit_hook:
        atexit.unregister(_at_exit)
        _exit_hook = False


def train_metrics(
    metrics: Any, step: Any, prefix: Any, tracker: Callable[[dict[str, float]], None] | None = None
) -> None:
    """Called with every ``Logger.log_metrics`` of the driver (``tracker``: logs our numbers); a
    failure of ours is one warning, never the training loop's (an error in strict mode)."""
    run = current
    if run is not None:
        _patching.guarded(
            "reading the training step's metrics",
            lambda: run.at_train_metrics(metrics, step, prefix, tracker),
            run.settings.strict,
        )


def end_of_training() -> None:
    """Called when an algorithm's train function returns or raises."""
    if current is not None:
        current.at_end("train_end")


def _at_exit() -> None:
    try:
        if current is not None:
            current.at_end("exit")
    except BaseException:
        pass
