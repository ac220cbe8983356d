"""The driver's finalize: collect, bind, write the report, print what is new, enforce ``on_mismatch``.

The driver calls ``finalize``: it collects the worker files, binds the training side to the rollout
side, writes ``<report_dir>/attention_align_report.json`` (atomically), prints the human summary
once and, with ``on_mismatch: error``, raises ``AttentionMismatch`` when the verdict is ``fail``.
Called again later in the run (``previous=`` the earlier document) it keeps the drift figures and
prints only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.compare.binding import Verdict
from nemo_rl_attn_align.errors import Finding, RuleViolation, Severity
from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide
from nemo_rl_attn_align.report.document import collect, with_logged_drift, write_report
from nemo_rl_attn_align.report.render import render_changes, render_summary
from nemo_rl_attn_align.report.store import PathLike


class AttentionMismatch(RuleViolation):
    """Raised by ``finalize`` / ``enforce`` with ``on_mismatch: error`` when the binding failed."""

    stops_run = True  # the plugin's guards let it through: stopping the run is its purpose


def _announcement(doc: Mapping[str, Any], previous: Mapping[str, Any] | None, path: Path, final: bool) -> str | None:
    """What ``finalize`` prints: the summary the first time, then only changes, one line at the end."""
    point, verdict, mode = doc["collected_at"], doc["verdict"], doc["settings"]["on_mismatch"]
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


def raise_for_mismatch(doc: Mapping[str, Any]) -> None:
    """``on_mismatch: error`` and verdict ``fail``: raise ``AttentionMismatch`` with the error findings."""
    if doc["settings"]["on_mismatch"] == "error" and doc["verdict"] == Verdict.FAIL.value:
        errors = [Finding.from_dict(f) for f in doc["findings"] if f["severity"] == Severity.ERROR.value]
        raise AttentionMismatch(errors)


def finalize(
    settings: Any,
    *,
    report_dir: PathLike | None = None,
    expected: Iterable[str] = (),
    collective: str | None = "auto",
    printer: Callable[[str], None] = print,
    absent_sides: Mapping[str, str] | None = None,
    run_id: str | None = None,
    previous: Mapping[str, Any] | None = None,
    point: str = "setup",
    final: bool = False,
    enforce: bool = True,
    preset: Mapping[str, Any] | None = None,
    expected_counts: Mapping[str, ExpectedSide] | None = None,
    attention_only: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Driver side: collect, bind, write the report, print what is new, enforce ``on_mismatch``.

    ``settings`` is ``settings.AlignSettings`` (``on_mismatch``, ``allow_dtype_difference``,
    ``to_mandate()``, ``report_dir``); ``report_dir`` overrides ``settings.report_dir`` (the
    driver passes the experiment's real log dir); ``run_id`` leaves out files of other runs;
    ``absent_sides`` as ``build_report``; ``point`` names the moment (``setup``, ``first_step``,
    ...), ``previous`` is the document an earlier call of this run returned (its drift figures and
    history are kept); ``final`` marks the run's last collection; ``preset`` is what
    ``attention_align.preset`` changed, kept under ``settings.preset``; ``expected_counts`` as
    ``build_report`` (with ``settings.strict``, a side with 0 of N workers is an error finding);
    ``attention_only`` is the run's attention-only drift estimate (``drift.estimate``).

    Printed, at most one message per call: the first time, the summary (``record``: one line with
    the path; ``final``: one line, e.g. after a failed setup); later, what changed, if anything
    (``record``: nothing); at the final call, one line with the verdict and the path when nothing
    changed. ``enforce`` and ``on_mismatch: error`` and verdict ``fail``: ``AttentionMismatch``,
    raised after the report is written and printed."""
    folder = Path(report_dir if report_dir is not None else settings.report_dir)
    doc = collect(
        folder,
        run_id=run_id,
        mandate=settings.to_mandate(),
        allow_dtype_difference=settings.allow_dtype_difference,
        on_mismatch=settings.on_mismatch,
        expected=expected,
        collective=collective,
        absent_sides=absent_sides,
        expected_counts=expected_counts,
        strict=bool(getattr(settings, "strict", False)),
    )
    _add_run_history(doc, folder, point, previous, preset, attention_only)
    path = write_report(folder, doc)
    message = _announcement(doc, previous, path, final)
    if message is not None:
        printer(message)
    if enforce:
        raise_for_mismatch(doc)
    return doc


def _add_run_history(
    doc: dict[str, Any],
    folder: Path,
    point: str,
    previous: Mapping[str, Any] | None,
    preset: Mapping[str, Any] | None,
    attention_only: Mapping[str, Any] | None,
) -> None:
    """What the run adds to a fresh collection: the moment ``point``, the preset, the drift steps and
    history of the ``previous`` document, the logged drift, the attention-only estimate, and
    ``point`` appended to the history."""
    doc["collected_at"] = point
    doc["settings"]["preset"] = dict(preset) if preset is not None else None
    if previous is not None:
        doc["drift"]["steps"] = list(previous["drift"]["steps"])
        doc["history"] = list(previous.get("history", []))
    with_logged_drift(doc, folder)
    if attention_only is not None:
        doc["drift"]["attention_only"] = dict(attention_only)
    doc["history"].append({"point": point, "created_at": doc["created_at"], "verdict": doc["verdict"]})
