"""Reading a report back: ``load_report`` reads a report file (or a report directory, collecting
the worker records when the driver never wrote the report) and checks its shape, raising
``ReportError`` with one line naming the file and what is wrong. Stdlib only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.binding.binding import Verdict
from nemo_rl_attn_align.config.settings import AlignSettings, OnMismatch
from nemo_rl_attn_align.report.document import REPORT_FILENAME, REPORT_KIND, collect, with_logged_drift
from nemo_rl_attn_align.report.store import (
    REPORT_SCHEMA_VERSION,
    WORKERS_DIR,
    PathLike,
    schema_version_ok,
)
from nemo_rl_attn_align.vocab.jsonio import read_json_file
from nemo_rl_attn_align.vocab.limits import MAX_REPORT_BYTES, InputRefused, shown_path


class ReportError(Exception):
    """A report that cannot be read; ``str(err)`` is one line naming the file and what is wrong."""


_REQUIRED_KEYS = (
    "schema_version",
    "kind",
    "verdict",
    "settings",
    "workers",
    "contracts",
    "binding",
    "findings",
    "drift",
)


#: The type each top-level section of a report must have.
_SECTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "settings": dict,
    "workers": dict,
    "contracts": list,
    "binding": (dict, type(None)),
    "findings": list,
    "drift": dict,
}


def _check_report(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != REPORT_KIND:
        raise ReportError(f"{where}: not a nemo-rl-attn-align report (expected kind {REPORT_KIND!r})")
    if not schema_version_ok(doc):
        version = str(doc.get("schema_version"))[:40]
        raise ReportError(
            f"{where}: report schema_version {version}; this version reads {REPORT_SCHEMA_VERSION} (an integer)"
        )
    missing = [key for key in _REQUIRED_KEYS if key not in doc]
    if missing:
        raise ReportError(f"{where}: report lacks {', '.join(missing)}")
    if not isinstance(doc["verdict"], str) or doc["verdict"] not in {v.value for v in Verdict}:
        raise ReportError(f"{where}: verdict {str(doc['verdict'])[:40]!r} is not one of pass, incomparable, fail")
    wrong = [key for key, kind in _SECTION_TYPES.items() if not isinstance(doc[key], kind)]
    if wrong:
        raise ReportError(
            f"{where}: report section {wrong[0]} is {type(doc[wrong[0]]).__name__}; the report is malformed"
        )
    try:  # a mapping of tiers, or one mode (reports written before on_mismatch was per tier)
        OnMismatch.of(doc["settings"].get("on_mismatch"))
    except ValueError as err:
        raise ReportError(f"{where}: settings: {err}; the report is malformed") from None
    return doc


def load_report(path: PathLike) -> dict[str, Any]:
    """The report at ``path``: the report file, or a report directory (its report file, or, when
    the driver never wrote one, a report collected now from the worker records with the default
    mandate). Raises ``ReportError`` with one line."""
    path = Path(path)
    where = shown_path(path)
    try:
        if path.is_dir():
            if (path / REPORT_FILENAME).is_file():
                path, where = path / REPORT_FILENAME, shown_path(path / REPORT_FILENAME)
            elif (path / WORKERS_DIR).is_dir():
                doc = collect(path, AlignSettings())
                doc["collected_from_workers"] = True
                return doc
            else:
                raise ReportError(f"{where}: no {REPORT_FILENAME} and no {WORKERS_DIR}/ in this directory")
        doc = read_json_file(path, MAX_REPORT_BYTES, "report")
    except json.JSONDecodeError as err:
        raise ReportError(f"{where}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except UnicodeDecodeError as err:
        raise ReportError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except InputRefused as err:
        raise ReportError(str(err)) from None
    except (OSError, ValueError) as err:  # missing, permission, symlink loop, name too long, NUL in the path
        raise ReportError(f"{where}: cannot read: {getattr(err, 'strerror', None) or err}") from None
    return with_logged_drift(_check_report(doc, where), path.parent)
