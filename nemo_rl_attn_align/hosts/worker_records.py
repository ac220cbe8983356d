"""Where a worker's findings go: one file per worker, written atomically, under the report dir.

Two files per worker, both rewritten in place (temp file + ``os.replace``) at every stage, so many
workers write at once without clobbering each other and a reader never sees half a file:

* ``<report_dir>/workers/<side>--<worker_id>.json``: the contract and determinism probe
  (``report.store.write_worker_record``), which the driver's ``report.finalize`` binds;
* ``<report_dir>/hosts/<side>--<worker_id>.json``: what the host hook saw on the way
  (``report.store.write_worker_detail``: the stage it reached, the plan it checked, NVTE variables,
  read-back details, layout, versions, findings (lines, and coded ones), world size and the ids of
  its peers).

Worker ids are ``vocab.worker_ids``'. Each detail names every id its worker group should have
(``peers``, from ``WORLD_SIZE``), so a worker that died before writing is a visible gap in the
report, never a corrupt file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.contract.contract import AttentionContract, FieldValue
from nemo_rl_attn_align.kernels.gpu import of_capability

if TYPE_CHECKING:
    from nemo_rl_attn_align.vocab.errors import Finding

log = logging.getLogger("nemo_rl_attn_align")
_warned_no_dir = False


def world_size(environ: Mapping[str, str] = os.environ) -> int:
    """This worker group's size, as NeMo-RL's ``RayWorkerGroup`` sets it (1 outside a group)."""
    try:
        return max(int(environ.get("WORLD_SIZE", "1") or 1), 1)
    except ValueError:
        return 1


def write(
    report_dir: str | None, contract: Any, probe: Any, detail: Mapping[str, Any], run_id: str | None = None
) -> Path | None:
    """Write both files for one worker; without a report dir, warn once and write nothing."""
    global _warned_no_dir
    from nemo_rl_attn_align.report.store import write_worker_detail, write_worker_record

    if not report_dir:
        if not _warned_no_dir:
            _warned_no_dir = True
            log.warning(
                "nemo-rl-attn-align: no report dir known in this worker, so its attention record is not written. "
                "Fix: run through NeMo-RL's algorithm setup (it exports attention_align.report_dir), "
                "or set NEMO_RL_ATTN_ALIGN_REPORT_DIR."
            )
        return None
    path = write_worker_record(report_dir, contract, probe, run_id)
    write_worker_detail(report_dir, contract.side, contract.worker_id, detail, run_id)
    return path


def guarded_step(step: str, action: Callable[[], object]) -> None:
    """Run one observability step of a worker that has no record yet: its failure is a warning,
    or an error in strict mode."""
    from nemo_rl_attn_align.vocab.patching import guarded

    guarded(step, action, HostRecord.settings().strict)


class HostRecord:
    """One worker's record while its host hook fills it in: findings, stage, write, strictness.

    Subclasses give ``contract()`` (an ``AttentionContract``), ``detail()`` (a JSON-ready dict) and
    ``peers()`` (the ids of every worker of its group). ``findings`` are lines (the report makes each
    a ``REPORT_WORKER_FINDING``), ``coded_findings`` findings with their own code, which the report
    keeps as they are. Failures of the plugin's own observability are warnings and findings of the
    record unless ``attention_align.strict``.
    """

    host = "host"

    def __init__(self):
        self.findings: list[str] = []
        self.coded_findings: list[Finding] = []
        self.stage = "started"
        self.probe: Any = None

    def contract(self) -> Any:
        raise NotImplementedError

    def detail(self) -> dict[str, Any]:
        raise NotImplementedError

    def peers(self) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def settings():
        from nemo_rl_attn_align.hosts import handoff

        return handoff.worker_settings()

    def write(self, stage: str) -> Path | None:
        """Rewrite this worker's two files with everything known at ``stage``."""
        self.stage = stage
        detail = {
            "host": self.host,
            "stage": stage,
            "findings": list(self.findings),
            "coded_findings": [f.to_dict() for f in self.coded_findings],
            "world_size": world_size(),
            "peers": self.peers(),
            **self.detail(),
        }

        settings = self.settings()
        return write(settings.report_dir, with_device(self.contract()), self.probe, detail, settings.run_id)

    def note(self, problem: str) -> None:
        """A difference between request and reality: warned now; strict mode stops after the write."""
        self.findings.append(problem)
        if not self.settings().strict:
            log.warning("nemo-rl-attn-align: %s", problem)

    def report(self, finding: Finding) -> None:
        """A finding with its own code (e.g. ``PACKED_BOUNDARIES_DROPPED``): warned now (its line);
        strict mode stops after the write."""
        self.coded_findings.append(finding)
        if not self.settings().strict:
            log.warning("nemo-rl-attn-align: %s", finding.line())

    def stop_if_strict(self) -> None:
        """In strict mode, any finding stops the run (after it has been written)."""
        from nemo_rl_attn_align.vocab.patching import StrictModeError

        lines = [*self.findings, *(f.line() for f in self.coded_findings)]
        if lines and self.settings().strict:
            raise StrictModeError("; ".join(lines) + ". attention_align.strict is true, so the run stops.")

    def guarded(self, step: str, action: Callable[[], Any], stops: tuple[type[Exception], ...] = ()) -> Any:
        """Run one step of the plugin's work in this worker (``action``'s result, None when it failed):
        a failure is one warning and a finding of this record, written with its detail where it can
        be; the run goes on. An error in strict mode; ``stops`` (the plugin's own stops) propagate."""
        from nemo_rl_attn_align.vocab.patching import guarded

        return guarded(step, action, self.settings().strict, stops, on_failure=self._keep_failure)

    def _keep_failure(self, problem: str) -> None:
        self.findings.append(problem)
        self.write(self.stage)


# The GPU a worker runs on, recorded in its contract (``gpu``), as the kernel tables name it: read from
# torch only where CUDA is already initialized in the worker's process (its engine has loaded the
# model), so recording never initializes CUDA itself (a forked process could not).
def device_gpu() -> FieldValue:
    """This process's GPU generation (observed), that it has none (observed null), or why it is not known."""
    try:
        import torch

        if not torch.cuda.is_available():
            return FieldValue.observed(None, "torch.cuda.is_available(): no CUDA device")
        if not torch.cuda.is_initialized():
            return FieldValue.unobservable(None, "CUDA is not initialized in this process when the record is written")
        major, minor = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    except Exception as err:  # observability: never breaks the worker
        return FieldValue.unobservable(None, f"torch.cuda: {type(err).__name__}: {err}")
    generation = of_capability(major, minor) or f"sm{major}{minor}"
    return FieldValue.observed(generation, f"torch.cuda.get_device_capability: {major}.{minor} ({name})")


def with_device(contract: AttentionContract) -> AttentionContract:
    """``contract`` with its ``gpu`` field read here, unless the worker's own reader set it."""
    if contract.fields["gpu"].provenance.known:
        return contract
    return AttentionContract(contract.side, contract.worker_id, {**contract.fields, "gpu": device_gpu()})
