"""The run report: one JSON document binding every worker's attention contract.

Each worker writes its own record (``write_worker_record``: its contract and determinism probe)
to ``<report_dir>/workers/`` atomically (a temp file in the same directory, then ``os.replace``),
so many processes can write at once and a reader never sees half a file. The driver then calls
``finalize``: it collects the records, binds the training side to the rollout side, writes
``<report_dir>/attention_align_report.json`` (atomically too), prints the human summary once and,
with ``on_mismatch: error``, raises ``AttentionMismatch`` when the verdict is ``fail``.

A worker that died leaves a gap (its expected id is listed as missing), a corrupt or foreign file
is listed as unreadable, a temp file left behind is listed as an incomplete write; none of them
stops the collection. The document's schema is ``docs/report-schema.md``. Stdlib only.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from nemo_rl_attn_align.binding import Code, Mandate, Status, Verdict, bind, same_value
from nemo_rl_attn_align.contract import SIDES, AttentionContract, Tier, field_spec, fields_of
from nemo_rl_attn_align.determinism import DeterminismProbe, collective_for, compare
from nemo_rl_attn_align.errors import Finding, RuleViolation, Severity

REPORT_SCHEMA_VERSION = 1
REPORT_KIND = "nemo-rl-attn-align/report"
WORKER_KIND = "nemo-rl-attn-align/worker"
REPORT_FILENAME = "attention_align_report.json"
WORKERS_DIR = "workers"

#: Drift metrics the report has room for, with what each measures. NeMo-RL logs the first four
#: (``nemo_rl/algorithms/loss/loss_functions.py``); verl logs the others as
#: ``training/rollout_probs_diff_*`` -- the prefix is accepted and dropped.
DRIFT_METRICS = {
    "token_mult_prob_error": "NeMo-RL: masked mean of exp(|generation_logprobs - train_logprobs|); 1.0 = no drift",
    "gen_kl_error": "NeMo-RL: masked mean KL of generation against training logprobs",
    "policy_kl_error": "NeMo-RL: masked mean KL of training against generation logprobs",
    "js_divergence_error": "NeMo-RL: masked mean Jensen-Shannon divergence",
    "rollout_probs_diff_max": "verl training/rollout_probs_diff_max: max |p_rollout - p_train| over tokens",
    "rollout_probs_diff_mean": "verl training/rollout_probs_diff_mean: mean |p_rollout - p_train|",
    "rollout_probs_diff_std": "verl training/rollout_probs_diff_std: std of |p_rollout - p_train|",
}

PathLike = Union[str, "os.PathLike[str]"]


class ReportError(Exception):
    """A report that cannot be read; ``str(err)`` is one line naming the file and what is wrong."""


class AttentionMismatch(RuleViolation):
    """Raised by ``finalize`` with ``on_mismatch: error`` when the binding failed."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def atomic_write_json(path: PathLike, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` atomically: a temp file in the same directory, fsync,
    ``os.replace``. Readers see the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def worker_record_path(report_dir: PathLike, side: str, worker_id: str) -> Path:
    """Where the record of ``worker_id`` on ``side`` lives (unsafe characters become ``_``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker_id)
    return Path(report_dir) / WORKERS_DIR / f"{side}--{safe}.json"


def write_worker_record(report_dir: PathLike, contract: AttentionContract, probe: Optional[DeterminismProbe] = None) -> Path:
    """Write one worker's contract and determinism probe (atomic; rewriting replaces it)."""
    record = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": WORKER_KIND,
        "side": contract.side,
        "worker_id": contract.worker_id,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "written_at": _now(),
        "contract": contract.to_dict(),
        "determinism": probe.to_dict() if probe is not None else None,
    }
    return atomic_write_json(worker_record_path(report_dir, contract.side, contract.worker_id), record)


def _parse_worker_record(path: Path) -> tuple[AttentionContract, Optional[DeterminismProbe]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("kind") != WORKER_KIND:
        raise ValueError(f"not a worker record (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    if data.get("schema_version") != REPORT_SCHEMA_VERSION:
        raise ValueError(f"schema_version {data.get('schema_version')!r}, this version reads {REPORT_SCHEMA_VERSION}")
    contract = AttentionContract.from_dict(data["contract"])
    probe = DeterminismProbe.from_dict(data["determinism"]) if data.get("determinism") is not None else None
    return contract, probe


def read_worker_records(report_dir: PathLike) -> dict[str, Any]:
    """Every worker record under ``report_dir``: ``records`` (contract, probe) sorted by side and
    worker id, ``unreadable`` (path and error) and ``incomplete_writes`` (temp files left over)."""
    folder = Path(report_dir) / WORKERS_DIR
    records, unreadable = [], []
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for path in paths:
        try:
            records.append(_parse_worker_record(path))
        except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError and ContractError are ValueErrors
            unreadable.append({"path": str(path), "error": f"{type(err).__name__}: {err}"})
    incomplete = sorted(str(p) for p in folder.glob(".*.tmp")) if folder.is_dir() else []
    records.sort(key=lambda rec: (rec[0].side, rec[0].worker_id))
    return {"records": records, "unreadable": unreadable, "incomplete_writes": incomplete}


def _divergences(representative: AttentionContract, other: AttentionContract) -> list[Finding]:
    """Identity/semantic fields where a worker disagrees with the first worker of its side."""
    out = []
    for name in fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC):
        a, b = representative[name], other[name]
        if a.known and b.known and not same_value(a.value, b.value):
            out.append(Finding(
                Code.WORKER_DIVERGES.value, Severity.ERROR, f"contract.{field_spec(name).tier.value}.{name}",
                f"{representative.worker_id}={a.value!r}, {other.worker_id}={b.value!r}",
                f"{other.side} worker {other.worker_id} disagrees with {representative.worker_id} on {name}",
                f"every {other.side} worker must run the same attention; check per-rank overrides",
            ))
    return out


def _known_tp(contracts: Iterable[AttentionContract]) -> list[Any]:
    return [c.value("tp_size") for c in contracts if c["tp_size"].known]


def build_report(
    records: Mapping[str, Any],
    *,
    mandate: Optional[Mandate],
    allow_dtype_difference: bool = False,
    on_mismatch: str = "warn",
    expected: Iterable[str] = (),
    collective: Optional[str] = "auto",
) -> dict[str, Any]:
    """The report document for ``read_worker_records``' result (see docs/report-schema.md).

    ``expected``: worker ids that should have written (missing ones are listed);
    ``collective``: the NCCL collective that reduces the compared tensor, ``None``, or ``auto``
    (``allreduce`` when some worker has tp_size > 1)."""
    contracts = [c for c, _ in records["records"]]
    probes = {(c.side, c.worker_id): p for c, p in records["records"]}
    by_side = {side: [c for c in contracts if c.side == side] for side in ("training", "rollout")}
    found = [c.worker_id for c in contracts]
    missing = sorted(set(expected) - set(found))
    findings: list[Finding] = []
    for worker in missing:
        findings.append(Finding(Code.WORKER_MISSING.value, Severity.WARNING, f"workers.{worker}", None,
                                f"worker {worker} wrote no record (it may have died before its engine was up)",
                                "check that worker's log; the binding below covers only the workers that wrote"))
    for bad in records["unreadable"]:
        findings.append(Finding(Code.RECORD_UNREADABLE.value, Severity.WARNING, "workers.record", bad["path"],
                                f"unreadable worker record: {bad['error']}", "remove the file or rerun that worker"))
    for side, members in by_side.items():
        for other in members[1:]:
            findings.extend(_divergences(members[0], other))
        if not members:
            findings.append(Finding(Code.SIDE_MISSING.value, Severity.WARNING, f"workers.{side}", None,
                                    f"no {side} worker wrote a record: nothing to bind",
                                    f"check that the {side} workers started with the plugin active"))
    binding = None
    if by_side["training"] and by_side["rollout"]:
        training, rollout = by_side["training"][0], by_side["rollout"][0]
        coll = collective_for(*_known_tp((training, rollout))) if collective == "auto" else collective
        t_probe, r_probe = probes[("training", training.worker_id)], probes[("rollout", rollout.worker_id)]
        diff = compare(t_probe, r_probe, coll) if t_probe is not None and r_probe is not None else None
        binding = bind(training, rollout, mandate, allow_dtype_difference=allow_dtype_difference, determinism=diff)
    diverges = any(f.code == Code.WORKER_DIVERGES.value for f in findings)
    if binding is None:
        verdict = Verdict.FAIL if diverges else Verdict.INCOMPARABLE
    elif diverges:
        verdict = Verdict.FAIL
    elif binding.verdict is Verdict.PASS and (missing or records["unreadable"]):
        verdict = Verdict.INCOMPARABLE
    else:
        verdict = binding.verdict
    binding_dict = binding.to_dict() if binding is not None else None
    all_findings = (binding_dict["findings"] if binding_dict else []) + [f.to_dict() for f in findings]
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "created_at": _now(),
        "verdict": verdict.value,
        "settings": {
            "on_mismatch": on_mismatch,
            "allow_dtype_difference": allow_dtype_difference,
            "mandate": mandate.to_dict() if mandate is not None else None,
        },
        "workers": {
            "expected": sorted(expected),
            "found": found,
            "missing": missing,
            "unreadable": list(records["unreadable"]),
            "incomplete_writes": list(records["incomplete_writes"]),
        },
        "contracts": [c.to_dict() for c in contracts],
        "determinism_probes": {side: {wid: (p.to_dict() if p is not None else None) for (s, wid), p in probes.items() if s == side}
                               for side in SIDES},
        "binding": binding_dict,
        "findings": all_findings,
        "drift": {"metrics": dict(DRIFT_METRICS), "steps": []},
    }


def collect(report_dir: PathLike, **options: Any) -> dict[str, Any]:
    """Read every worker record under ``report_dir`` and build the report document (writes
    nothing); ``options`` are ``build_report``'s."""
    return build_report(read_worker_records(report_dir), **options)


def write_report(report_dir: PathLike, doc: Mapping[str, Any]) -> Path:
    """Write the report document to ``<report_dir>/attention_align_report.json`` atomically."""
    return atomic_write_json(Path(report_dir) / REPORT_FILENAME, doc)


_REQUIRED_KEYS = ("schema_version", "kind", "verdict", "settings", "workers", "contracts", "binding", "findings", "drift")


def _check_report(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != REPORT_KIND:
        raise ReportError(f"{where}: not a nemo-rl-attn-align report (expected kind {REPORT_KIND!r})")
    if doc.get("schema_version") != REPORT_SCHEMA_VERSION:
        raise ReportError(f"{where}: report schema_version {doc.get('schema_version')!r}; this version reads {REPORT_SCHEMA_VERSION}")
    missing = [key for key in _REQUIRED_KEYS if key not in doc]
    if missing:
        raise ReportError(f"{where}: report lacks {', '.join(missing)}")
    if doc["verdict"] not in {v.value for v in Verdict}:
        raise ReportError(f"{where}: verdict {doc['verdict']!r} is not one of pass, incomparable, fail")
    return doc


def load_report(path: PathLike) -> dict[str, Any]:
    """The report at ``path``: the report file, or a report directory (its report file, or, when
    the driver never wrote one, a report collected now from the worker records with the default
    mandate). Raises ``ReportError`` with one line."""
    path = Path(path)
    if path.is_dir():
        if (path / REPORT_FILENAME).is_file():
            path = path / REPORT_FILENAME
        elif (path / WORKERS_DIR).is_dir():
            doc = collect(path, mandate=Mandate())
            doc["collected_from_workers"] = True
            return doc
        else:
            raise ReportError(f"{path}: no {REPORT_FILENAME} and no {WORKERS_DIR}/ in this directory")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ReportError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    return _check_report(doc, str(path))


def _drift_name(name: str) -> str:
    key = name.removeprefix("training/")
    if key not in DRIFT_METRICS:
        raise ValueError(f"unknown drift metric {name!r}; known: {', '.join(DRIFT_METRICS)}")
    return key


def record_drift(path: PathLike, step: int, metrics: Mapping[str, float]) -> dict[str, Any]:
    """Add (or replace) the drift figures of ``step`` in the report at ``path`` (driver only:
    one writer). Names are ``DRIFT_METRICS`` keys; verl's ``training/`` prefix is accepted."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    entry: dict[str, Any] = {"step": step}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"drift metric {name} must be a finite number, got {value!r}")
        entry[_drift_name(name)] = float(value)
    file = Path(path) / REPORT_FILENAME if Path(path).is_dir() else Path(path)
    doc = load_report(file)
    steps = [s for s in doc["drift"]["steps"] if s.get("step") != step] + [entry]
    doc["drift"]["steps"] = sorted(steps, key=lambda s: s["step"])
    atomic_write_json(file, doc)
    return doc


# --- human rendering ---------------------------------------------------------------------------

_TAGS = {"observed": "obs", "configured": "cfg", "unobservable": "unobs", "pending": "pending"}


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain left-aligned text table."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _short(value: Any, limit: int = 30) -> str:
    text = "null" if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _side_cell(fv: Mapping[str, Any]) -> str:
    tag = _TAGS.get(fv["provenance"], fv["provenance"])
    if fv["provenance"] == "pending":
        return "? [pending]"
    return f"{_short(fv['value'])} [{tag}]"


def _det_cell(entry: Mapping[str, Any], side: str) -> str:
    value = entry[side]
    return "unset" if value is None and entry["kind"] == "env" else _short(value)


def render_binding(binding: Mapping[str, Any], full: bool = False) -> str:
    """The binding (``BindingReport.to_dict()``) as a table of the fields that are not a plain
    match (one line names those that are); ``full=True`` lists every field and variable."""
    rows, matched = [], []
    for r in binding["fields"]:
        if r["status"] == Status.MATCH.value and not full:
            matched.append(r["field"])
            continue
        status = r["status"].upper() if r["status"] == Status.MISMATCH.value else r["status"]
        rows.append([r["field"], r["tier"], status, _side_cell(r["training"]), _side_cell(r["rollout"]),
                     "" if r["mandate"] is None else _short(r["mandate"])])
    lines = [f"binding {binding['training_worker']} <-> {binding['rollout_worker']}: {binding['summary']}",
             f"passed: {str(binding['passed']).lower()}, comparable: {str(binding['comparable']).lower()}"]
    if matched:
        lines.append(f"match on both sides ({len(matched)}): {', '.join(matched)}")
    if rows:
        lines.append(format_table(["field", "tier", "status", "training", "rollout", "mandate"], rows))
    det = binding.get("determinism")
    if det is not None:
        hidden = ("match", "not_probed") if not full else ()
        rows = [[e["name"], e["tier"], e["status"].upper() if e["status"] == "mismatch" else e["status"],
                 _det_cell(e, "training"), _det_cell(e, "rollout"), e["note"]]
                for e in det["entries"] if e["status"] not in hidden]
        lines.append(f"determinism (collective: {det['collective'] or 'none reduces the compared tensor'}; "
                     f"torch flags: training {det['training_torch_status']}, rollout {det['rollout_torch_status']}):")
        lines.append(format_table(["variable", "tier", "status", "training", "rollout", "note"], rows) if rows
                     else "  no variable or flag differs")
    return "\n".join(lines)


def render_findings(findings: list[Mapping[str, Any]], shown: tuple[str, ...] = ("error", "warning")) -> list[str]:
    """One line per finding (dicts) of the ``shown`` severities, then a count of the others."""
    lines = [f"{f['severity']} {f['code']}: {f['key']}: {f['message']} Fix: {f['fix']}" for f in findings if f["severity"] in shown]
    hidden = sum(f["severity"] not in shown for f in findings)
    if hidden:
        lines.append(f"(+{hidden} more findings of severity other than {'/'.join(shown)} in the JSON)")
    return lines


def render_summary(doc: Mapping[str, Any], full: bool = False) -> str:
    """The human summary of a report document (``full``: every field and variable)."""
    workers = doc["workers"]
    by_side: dict[str, list[str]] = {}
    for c in doc["contracts"]:
        by_side.setdefault(c["side"], []).append(c["worker_id"])
    lines = [
        f"nemo-rl-attn-align report: verdict {doc['verdict'].upper()} (on_mismatch: {doc['settings']['on_mismatch']})",
        "workers: " + "; ".join(f"{side} {', '.join(by_side[side])}" for side in SIDES if side in by_side)
        + f"; missing: {', '.join(workers['missing']) or 'none'}; unreadable: {len(workers['unreadable'])}"
        + f"; incomplete writes: {len(workers['incomplete_writes'])}",
    ]
    if doc.get("collected_from_workers"):
        lines.append("(collected from worker records now: the driver wrote no report; default mandate)")
    if doc["binding"] is not None:
        lines.append(render_binding(doc["binding"], full))
    steps = doc["drift"]["steps"]
    if steps:
        last = steps[-1]
        figures = ", ".join(f"{k}={v:.6g}" for k, v in last.items() if k != "step")
        lines.append(f"drift at step {last['step']} ({len(steps)} steps recorded): {figures}")
    else:
        lines.append("drift: none recorded yet")
    lines.extend(render_findings(doc["findings"]))
    return "\n".join(lines)


def finalize(
    settings: Any,
    *,
    report_dir: Optional[PathLike] = None,
    expected: Iterable[str] = (),
    collective: Optional[str] = "auto",
    printer: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Driver side, once every worker wrote: collect, bind, write the report, print once, enforce.

    ``settings`` is ``settings.AlignSettings`` (``on_mismatch``, ``allow_dtype_difference``,
    ``to_mandate()``, ``report_dir``); ``report_dir`` overrides ``settings.report_dir`` (the
    driver passes the experiment's real log dir). ``error`` + verdict ``fail`` raises
    ``AttentionMismatch`` after the report is written; ``warn`` prints the summary; ``record``
    prints one line saying where the report is."""
    folder = Path(report_dir if report_dir is not None else settings.report_dir)
    doc = collect(folder, mandate=settings.to_mandate(), allow_dtype_difference=settings.allow_dtype_difference,
                  on_mismatch=settings.on_mismatch, expected=expected, collective=collective)
    path = write_report(folder, doc)
    if settings.on_mismatch == "record":
        printer(f"attention_align: verdict {doc['verdict']}; report written to {path}")
    else:
        printer(render_summary(doc) + f"\nreport written to {path}")
    if settings.on_mismatch == "error" and doc["verdict"] == Verdict.FAIL.value:
        errors = [Finding(f["code"], Severity(f["severity"]), f["key"], f["value"], f["message"], f["fix"])
                  for f in doc["findings"] if f["severity"] == Severity.ERROR.value]
        raise AttentionMismatch(errors)
    return doc
