"""The driver's finalize: collect, bind, write the report, print what is new, enforce ``on_mismatch``.

The driver calls ``finalize``: it collects the worker files, binds the training side to the rollout
side, writes ``<report_dir>/attention_align_report.json`` (atomically), prints the human summary
once and raises ``AttentionMismatch`` when a failed tier's ``on_mismatch`` is ``error``.
Called again later in the run (``Collection.previous``: the earlier document) it keeps the drift
figures and prints only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.binding.binding import Verdict
from nemo_rl_attn_align.config.settings import AlignSettings, OnMismatch
from nemo_rl_attn_align.report.document import RunDescription, collect, with_logged_drift, write_report
from nemo_rl_attn_align.report.report_render import render_changes, render_summary
from nemo_rl_attn_align.vocab.codes import Code, Kind, codes_of
from nemo_rl_attn_align.vocab.errors import Finding, RuleViolation, Severity


class AttentionMismatch(RuleViolation):
    """Raised by ``finalize`` / ``enforce`` when a tier whose ``on_mismatch`` is ``error`` failed."""

    stops_run = True  # the plugin's guards let it through: stopping the run is its purpose


def _announcement(doc: Mapping[str, Any], previous: Mapping[str, Any] | None, path: Path, final: bool) -> str | None:
    """What ``finalize`` prints: the summary the first time, then only changes, one line at the end."""
    point, verdict = doc["collected_at"], doc["verdict"]
    mode = OnMismatch.of(doc["settings"]["on_mismatch"]).applied(failed_tiers(doc))
    if previous is None:
        if mode == "record" or final:
            missing = f"; missing: {', '.join(doc['workers']['missing'])}" if doc["workers"]["missing"] else ""
            return f"attention_align ({point}): verdict {verdict}{missing}; report written to {path}"
        return render_summary(doc) + f"\nreport written to {path}"
    if mode == "record":
        return None
    changes = render_changes(previous, doc)
    if changes:
        return "\n".join(
            [f"attention_align ({point}): the report changed since {previous.get('collected_at')}:"]
            + [f"  {line}" for line in changes]
            + [f"report updated: {path}"]
        )
    if final:
        since = previous.get("collected_at")
        return f"attention_align ({point}): verdict {verdict}, unchanged since {since}; report: {path}"
    return None


def failed_tiers(doc: Mapping[str, Any]) -> list[str]:
    """The tiers that fail a report: the binding's, and ``identity`` where workers of one side diverge
    (they run different models or settings) or a worker's hook found an error in its host (e.g.
    ``PACKED_BOUNDARIES_DROPPED``: that side computes another function)."""
    if doc["verdict"] != Verdict.FAIL.value:
        return []
    failed = list((doc.get("binding") or {}).get("failed_tiers", []))
    if any(_fails_identity(f) for f in doc["findings"]) and "identity" not in failed:
        failed.insert(0, "identity")
    return failed


def _fails_identity(finding: Mapping[str, Any]) -> bool:
    if finding["code"] == Code.REPORT_WORKER_DIVERGES.value:
        return True
    return finding["severity"] == Severity.ERROR.value and finding["code"] in {c.value for c in codes_of(Kind.HOST)}


def raise_for_mismatch(doc: Mapping[str, Any]) -> None:
    """A failed tier whose ``on_mismatch`` is ``error``: raise ``AttentionMismatch`` with the error findings."""
    failed = failed_tiers(doc)
    if failed and OnMismatch.of(doc["settings"]["on_mismatch"]).applied(failed) == "error":
        errors = [Finding.from_dict(f) for f in doc["findings"] if f["severity"] == Severity.ERROR.value]
        raise AttentionMismatch(errors)


@dataclass(frozen=True)
class Collection:
    """One collection of a run's report: the moment it names (``setup``, ``first_step``, ...), the
    document the run's earlier collection returned (its drift figures and history are kept), and
    whether it is the run's last."""

    point: str = "setup"
    previous: Mapping[str, Any] | None = None
    final: bool = False


def finalize(
    settings: AlignSettings,
    run: RunDescription = RunDescription(),
    at: Collection = Collection(),
    *,
    printer: Callable[[str], None] = print,
    enforce: bool = True,
) -> dict[str, Any]:
    """Driver side: collect ``settings.report_dir`` (``document.collect``), bind, write the report,
    print what is new, enforce ``on_mismatch``. The run's ``preset`` is kept under
    ``settings.preset``, its ``attention_only`` estimate under ``drift``.

    Printed, at most one message per call: the first time, the summary (``record``: one line with
    the path; ``final``: one line, e.g. after a failed setup); later, what changed, if anything
    (``record``: nothing); at the final call, one line with the verdict and the path when nothing
    changed. ``enforce`` and a failed tier whose ``on_mismatch`` is ``error``: ``AttentionMismatch``,
    raised after the report is written and printed."""
    folder = Path(settings.report_dir)
    doc = collect(folder, settings, run)
    _add_run_history(doc, folder, run, at)
    path = write_report(folder, doc)
    message = _announcement(doc, at.previous, path, at.final)
    if message is not None:
        printer(message)
    if enforce:
        raise_for_mismatch(doc)
    return doc


def _add_run_history(doc: dict[str, Any], folder: Path, run: RunDescription, at: Collection) -> None:
    """What the run adds to a fresh collection: the moment, the preset, the drift steps and history
    of the previous document, the logged drift, the attention-only estimate, and the moment
    appended to the history."""
    doc["collected_at"] = at.point
    doc["settings"]["preset"] = dict(run.preset) if run.preset is not None else None
    if at.previous is not None:
        doc["drift"]["steps"] = list(at.previous["drift"]["steps"])
        doc["history"] = list(at.previous.get("history", []))
    with_logged_drift(doc, folder)
    if run.attention_only is not None:
        doc["drift"]["attention_only"] = dict(run.attention_only)
    doc["history"].append({"point": at.point, "created_at": doc["created_at"], "verdict": doc["verdict"]})
