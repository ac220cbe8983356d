"""The drift log: one line of JSON per training step, appended, so a step costs the same at step 1
and at step 100,000.

The driver appends each step's drift figures to ``<report_dir>/drift/<run_id>.jsonl``
(``append_step``): one ``os.write`` of one line on a file opened with ``O_APPEND``, so writers never
interleave and a process killed mid-write leaves at most one torn last line. ``read_steps`` reads
the log back (a torn or foreign line is skipped; a step logged twice keeps its last figures); the
report document takes its ``drift.steps`` from it at each collection point and whenever
``report`` loads a report, so the log can be read while the run goes on. Stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.report.store import resolved, safe_name
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_REPORT_BYTES, read_text

DRIFT_DIR = "drift"


def drift_log_path(report_dir: str | os.PathLike[str], run_id: str | None) -> Path:
    """Where run ``run_id`` logs its drift steps (``run`` when the run has no id)."""
    name = safe_name(run_id) if isinstance(run_id, str) and run_id else "run"
    return resolved(report_dir) / DRIFT_DIR / f"{name}.jsonl"


def append_step(path: Path, entry: dict[str, Any]) -> None:
    """Append one step's entry (``{"step": N, metric: value, ...}``) as one line (after a torn
    last line, on a line of its own)."""
    line = (jsonio.dumps(entry, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn line of a killed writer: end it first
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


def _entry(line: str) -> dict[str, Any] | None:
    try:
        entry = jsonio.loads(line, "drift log line")
    except ValueError:  # not JSON, or not strict JSON
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or isinstance(entry["step"], bool):
        return None
    return entry


def read_steps(path: Path) -> list[dict[str, Any]] | None:
    """The steps logged at ``path``, in step order (None when there is no log). Complete lines
    only: a torn last line of a killed writer, or a line that is not a step entry, is skipped."""
    if not path.is_file():
        return None
    text = read_text(path, MAX_REPORT_BYTES, "drift log")
    lines = text.split("\n")[:-1]  # the part after the last newline is incomplete
    by_step = {}
    for line in lines:
        entry = _entry(line)
        if entry is not None:
            by_step[entry["step"]] = entry
    return [by_step[step] for step in sorted(by_step)]
