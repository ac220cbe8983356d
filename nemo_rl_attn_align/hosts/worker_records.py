"""Where a worker's findings go: one file per worker, written atomically, under the report dir.

Two files per worker, both rewritten in place (temp file + ``os.replace``, ``report.atomic_write_json``)
at every stage, so many workers write at once without clobbering each other and a reader never
sees half a file:

* ``<report_dir>/workers/<side>--<worker_id>.json``: the contract and determinism probe, written by
  ``report.write_worker_record`` (the driver's ``report.finalize`` binds these);
* ``<report_dir>/hosts/<side>--<worker_id>.json``: what the host hook saw on the way (the stage it
  reached, the plan it checked, NVTE variables, read-back details, layout, versions, findings).

A worker that dies leaves its last stage behind: a visible gap, never a corrupt file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

HOSTS_DIR = "hosts"
DETAIL_KIND = "nemo-rl-attn-align/host-detail"

log = logging.getLogger("nemo_rl_attn_align")
_warned_no_dir = False


def put_field(builder: Any, name: str, value: Any, source: str, how: str = "observed") -> None:
    """Set one contract field on ``builder``; a missing observed value, or one the schema rejects,
    is recorded as unobservable with the reason, never guessed."""
    from nemo_rl_attn_align.contract import ContractError

    if value is None and how == "observed":
        builder.unobservable(name, None, f"{source}: not available in this host")
        return
    try:
        getattr(builder, how)(name, value, source)
    except ContractError as err:
        builder.unobservable(name, None, f"{source}: {err}")


def detail_path(report_dir: str | Path, side: str, worker_id: str) -> Path:
    """Where the host detail of ``worker_id`` lives (same naming as the contract record)."""
    from nemo_rl_attn_align.report import worker_record_path

    return Path(report_dir) / HOSTS_DIR / worker_record_path(report_dir, side, worker_id).name


def write(report_dir: str | None, contract: Any, probe: Any, detail: Mapping[str, Any]) -> Path | None:
    """Write both files for one worker; without a report dir, warn once and write nothing."""
    global _warned_no_dir
    from nemo_rl_attn_align.report import atomic_write_json, write_worker_record

    if not report_dir:
        if not _warned_no_dir:
            _warned_no_dir = True
            log.warning(
                "nemo-rl-attn-align: no report dir known in this worker, so its attention record is not written. "
                "Fix: run through NeMo-RL's algorithm setup (it exports attention_align.report_dir), "
                "or set NEMO_RL_ATTN_ALIGN_REPORT_DIR."
            )
        return None
    path = write_worker_record(report_dir, contract, probe)
    body = {"kind": DETAIL_KIND, "side": contract.side, "worker_id": contract.worker_id, **detail}
    atomic_write_json(detail_path(report_dir, contract.side, contract.worker_id), body)
    return path


def read_details(report_dir: str | Path) -> dict[str, Any]:
    """Every host detail under ``report_dir``: ``details`` by ``<side>--<worker_id>``, and ``unreadable``."""
    import json

    folder = Path(report_dir) / HOSTS_DIR
    details, unreadable = {}, []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("kind") != DETAIL_KIND:
                raise ValueError(f"kind {data.get('kind')!r} is not {DETAIL_KIND}")
            details[path.stem] = data
        except (OSError, ValueError, AttributeError) as err:
            unreadable.append({"path": str(path), "error": f"{type(err).__name__}: {err}"})
    return {"details": details, "unreadable": unreadable}


class HostRecord:
    """One worker's record while its host hook fills it in: findings, stage, write, strictness.

    Subclasses give ``contract()`` (an ``AttentionContract``) and ``detail()`` (a JSON-ready dict).
    Failures of the plugin's own observability are warnings unless ``attention_align.strict``.
    """

    host = "host"

    def __init__(self):
        self.findings: list[str] = []
        self.stage = "started"
        self.probe: Any = None

    def contract(self) -> Any:
        raise NotImplementedError

    def detail(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def settings():
        from nemo_rl_attn_align.hosts import handoff

        return handoff.worker_settings()

    def write(self, stage: str) -> Path | None:
        """Rewrite this worker's two files with everything known at ``stage``."""
        self.stage = stage
        detail = {"host": self.host, "stage": stage, "findings": list(self.findings), **self.detail()}
        return write(self.settings().report_dir, self.contract(), self.probe, detail)

    def note(self, problem: str) -> None:
        """A difference between request and reality: warned now; strict mode stops after the write."""
        self.findings.append(problem)
        if not self.settings().strict:
            log.warning("nemo-rl-attn-align: %s", problem)

    def stop_if_strict(self) -> None:
        """In strict mode, any finding stops the run (after it has been written)."""
        from nemo_rl_attn_align.hosts._patching import StrictModeError

        if self.findings and self.settings().strict:
            raise StrictModeError("; ".join(self.findings) + ". attention_align.strict is true, so the run stops.")

    @classmethod
    def guarded(cls, step: str, action: Callable[[], None]) -> None:
        """Run one observability step: its failure is a warning, or an error in strict mode."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001
            if cls.settings().strict or getattr(exc, "stops_run", False):
                raise
            log.warning("nemo-rl-attn-align: %s failed (%s: %s); the run goes on unrecorded", step, type(exc).__name__, exc)
