"""The run report: one JSON document binding every worker's attention contract.

Each worker writes its own files, atomically (a temp file in the same directory, then
``os.replace``), so many processes can write at once and a reader never sees half a file:

* ``<report_dir>/workers/<side>--<worker_id>.json`` (``write_worker_record``): its contract and
  determinism probe;
* ``<report_dir>/hosts/<side>--<worker_id>.json`` (``write_worker_detail``): what its host hook saw
  (the stage it reached, findings such as a read-back mismatch, its peers).

The driver then calls ``finalize``: it collects both, binds the training side to the rollout side,
writes ``<report_dir>/attention_align_report.json`` (atomically too), prints the human summary once
and, with ``on_mismatch: error``, raises ``AttentionMismatch`` when the verdict is ``fail``. Called
again later in the run (``previous=`` the earlier document) it keeps the drift figures and prints
only what changed.

A worker that died leaves a gap (its expected id is listed as missing), a corrupt or foreign file
is listed as unreadable, a temp file left behind is listed as an incomplete write, a file another
run wrote is listed as stale; none of them stops the collection. The document's schema is
``docs/report-schema.md``. Stdlib only.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from nemo_rl_attn_align.codes import Code
from nemo_rl_attn_align.compare.binding import Mandate, Status, Verdict, bind, same_value
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.contract.schema import SIDES, Tier, field_spec, fields_of
from nemo_rl_attn_align.compare.determinism import DeterminismProbe, collective_for, compare
from nemo_rl_attn_align.errors import Finding, RuleViolation, Severity, format_finding
from nemo_rl_attn_align.limits import MAX_NESTING, MAX_RECORD_BYTES, MAX_REPORT_BYTES, InputRefused, nesting_depth, read_text, shown_path

REPORT_SCHEMA_VERSION = 1
REPORT_KIND = "nemo-rl-attn-align/report"
WORKER_KIND = "nemo-rl-attn-align/worker"
DETAIL_KIND = "nemo-rl-attn-align/host-detail"
REPORT_FILENAME = "attention_align_report.json"
WORKERS_DIR = "workers"
HOSTS_DIR = "hosts"

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
    """Raised by ``finalize`` / ``enforce`` with ``on_mismatch: error`` when the binding failed."""

    stops_run = True  # the plugin's guards let it through: stopping the run is its purpose


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


#: Longest worker file name: the temp name adds ``.`` + ``.XXXXXXXX.tmp`` and must stay within
#: the 255 bytes most file systems allow.
_MAX_FILE_NAME = 200


#: A temp file untouched this long belongs to a writer that died (a live write takes milliseconds).
STALE_TEMP_AGE_S = 10.0


def remove_stale_temp_files(report_dir: PathLike, older_than_s: float = STALE_TEMP_AGE_S) -> list[str]:
    """Delete the temp files (``.*.tmp``) that writers killed mid-write left in ``report_dir``,
    ``workers/`` and ``hosts/``, when untouched for ``older_than_s``; returns their paths. Never raises."""
    removed, cutoff = [], time.time() - older_than_s
    for folder in (Path(report_dir), Path(report_dir) / WORKERS_DIR, Path(report_dir) / HOSTS_DIR):
        try:
            candidates = sorted(folder.glob(".*.tmp")) if folder.is_dir() else []
        except OSError:
            continue
        for path in candidates:
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed.append(str(path))
            except OSError:
                continue
    return removed


def _worker_file(report_dir: PathLike, folder: str, side: str, worker_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker_id)
    name = f"{side}--{safe}.json"
    if len(name) > _MAX_FILE_NAME:  # a very long id: cut, with a digest of the whole id (the record keeps it whole)
        digest = hashlib.sha256(worker_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = f"{side}--{safe[: _MAX_FILE_NAME - len(side) - 25]}-{digest}.json"
    return Path(report_dir) / folder / name


def worker_record_path(report_dir: PathLike, side: str, worker_id: str) -> Path:
    """Where the record of ``worker_id`` on ``side`` lives (unsafe characters become ``_``)."""
    return _worker_file(report_dir, WORKERS_DIR, side, worker_id)


def worker_detail_path(report_dir: PathLike, side: str, worker_id: str) -> Path:
    """Where the host detail of ``worker_id`` on ``side`` lives (same name, under ``hosts/``)."""
    return _worker_file(report_dir, HOSTS_DIR, side, worker_id)


def write_worker_record(report_dir: PathLike, contract: AttentionContract, probe: Optional[DeterminismProbe] = None,
                        run_id: Optional[str] = None) -> Path:
    """Write one worker's contract and determinism probe (atomic; rewriting replaces it).
    ``run_id``: the driver's id of this run (records of other runs are then stale)."""
    record = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": WORKER_KIND,
        "side": contract.side,
        "worker_id": contract.worker_id,
        "run_id": run_id,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "written_at": _now(),
        "contract": contract.to_dict(),
        "determinism": probe.to_dict() if probe is not None else None,
    }
    return atomic_write_json(worker_record_path(report_dir, contract.side, contract.worker_id), record)


def write_worker_detail(report_dir: PathLike, side: str, worker_id: str, detail: Mapping[str, Any],
                        run_id: Optional[str] = None) -> Path:
    """Write what one worker's host hook saw (atomic; rewriting replaces it). The report reads its
    ``stage`` (str), ``findings`` (list of str), ``host`` and ``peers`` (the worker ids its group
    should have); every other key is kept for humans."""
    body = {"kind": DETAIL_KIND, "side": side, "worker_id": worker_id, "run_id": run_id, **detail}
    return atomic_write_json(worker_detail_path(report_dir, side, worker_id), body)


def _schema_version_ok(data: Mapping[str, Any]) -> bool:
    """Exactly the integer ``REPORT_SCHEMA_VERSION`` (``1.0`` and ``true`` equal 1 in Python, but are not it)."""
    version = data.get("schema_version")
    return type(version) is int and version == REPORT_SCHEMA_VERSION


def _parse_worker_record(data: Any) -> tuple[AttentionContract, Optional[DeterminismProbe]]:
    if not isinstance(data, dict) or data.get("kind") != WORKER_KIND:
        raise ValueError(f"not a worker record (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    if not _schema_version_ok(data):
        raise ValueError(f"schema_version {data.get('schema_version')!r}, this version reads {REPORT_SCHEMA_VERSION}")
    contract = AttentionContract.from_dict(data["contract"])
    probe = DeterminismProbe.from_dict(data["determinism"]) if data.get("determinism") is not None else None
    return contract, probe


def _parse_detail(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("kind") != DETAIL_KIND:
        raise ValueError(f"not a host detail (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    if data.get("side") not in SIDES or not isinstance(data.get("worker_id"), str):
        raise ValueError("a host detail needs side (training or rollout) and worker_id")
    for key, kinds in (("stage", (str, type(None))), ("host", (str, type(None))), ("findings", (list, type(None))),
                       ("peers", (list, type(None)))):
        if not isinstance(data.get(key), kinds):
            raise ValueError(f"host detail {key} is {type(data.get(key)).__name__}, not {' or '.join(k.__name__ for k in kinds)}")
    for key in ("findings", "peers"):
        if not all(isinstance(item, str) for item in data.get(key) or []):
            raise ValueError(f"host detail {key} holds a value that is not a string")
    return data


def read_json_file(path: PathLike, limit: int, what: str) -> Any:
    """The parsed JSON of the regular file ``path`` (at most ``limit`` bytes, nested at most
    ``MAX_NESTING`` deep). Raises ``ValueError`` with one line (``InputRefused``, bad UTF-8, bad
    JSON, too deep) or ``OSError``; a FIFO or device is refused without blocking."""
    try:
        data = json.loads(read_text(path, limit, what))
    except RecursionError:
        raise InputRefused(f"{what} {shown_path(path)} nests deeper than {MAX_NESTING} levels") from None
    if nesting_depth(data) > MAX_NESTING:
        raise InputRefused(f"{what} {shown_path(path)} nests deeper than {MAX_NESTING} levels")
    return data


def _read_folder(folder: Path, parse: Callable[[Any], Any], run_id: Optional[str], out: dict[str, list]) -> list:
    parsed = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = read_json_file(path, MAX_RECORD_BYTES, "worker file")
            item = parse(data)
        except Exception as err:  # noqa: BLE001 - any bad file is listed as unreadable; the collection goes on
            out["unreadable"].append({"path": str(path), "error": f"{type(err).__name__}: {str(err)[:500]}"})
            continue
        if run_id is not None and data.get("run_id") != run_id:
            out["stale"].append(str(path))
        else:
            parsed.append(item)
    out["incomplete_writes"].extend(sorted(str(p) for p in folder.glob(".*.tmp")) if folder.is_dir() else [])
    return parsed


def read_worker_records(report_dir: PathLike, run_id: Optional[str] = None) -> dict[str, Any]:
    """Every worker file under ``report_dir``: ``records`` (contract, probe) sorted by side and
    worker id, ``details`` (host details by ``(side, worker_id)``), ``unreadable`` (path and error),
    ``incomplete_writes`` (temp files left over) and, when ``run_id`` is given, ``stale`` (files
    another run wrote, left out)."""
    out: dict[str, Any] = {"unreadable": [], "incomplete_writes": [], "stale": []}
    records = _read_folder(Path(report_dir) / WORKERS_DIR, _parse_worker_record, run_id, out)
    details = _read_folder(Path(report_dir) / HOSTS_DIR, _parse_detail, run_id, out)
    records.sort(key=lambda rec: (rec[0].side, rec[0].worker_id))
    return {"records": records, "details": {(d["side"], d["worker_id"]): d for d in details}, **out}


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


def _detail_findings(details: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Finding]:
    """What the host hooks noticed (e.g. Transformer Engine ran another backend than requested)."""
    out = []
    for (side, worker_id), detail in sorted(details.items()):
        for problem in detail.get("findings") or []:
            out.append(Finding(
                Code.WORKER_FINDING.value, Severity.WARNING, f"workers.{worker_id}", detail.get("stage"),
                f"{side} worker {worker_id} ({detail.get('host', 'hook')}): {problem}",
                f"see {HOSTS_DIR}/{worker_detail_path('.', side, worker_id).name} for what the hook saw; "
                "attention_align.strict: true stops the run on such a finding",
            ))
    return out


def side_coverage(by_side: Mapping[str, list], expected_counts: Mapping[str, Mapping[str, Any]],
                  peers: Mapping[str, set] = {}) -> dict[str, Any]:
    """Side -> ``{"recorded": k, "expected": N or None, "how": ...}`` for each side the config
    starts workers for (``expected_counts``) or that some worker recorded; without the config's
    count, N is the number of ids the side's host details name as ``peers`` (None when none do)."""
    coverage = {}
    for side in SIDES:
        expected = dict(expected_counts.get(side) or {})
        if not expected and not by_side.get(side):
            continue
        if not expected and peers.get(side):
            expected = {"count": len(peers[side]), "ids": sorted(peers[side]), "how": "the peers the workers' host details name"}
        ids = set(expected.get("ids") or ())
        recorded = [c.worker_id for c in by_side.get(side, [])]
        coverage[side] = {"recorded": len([w for w in recorded if w in ids]) if ids else len(recorded),
                          "expected": expected.get("count"), "how": expected.get("how") or "not derived from the config"}
    return coverage


def _peers_by_side(details: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, set]:
    peers: dict[str, set] = {}
    for (side, _), detail in details.items():
        peers.setdefault(side, set()).update(p for p in detail.get("peers") or [] if isinstance(p, str))
    return peers


def coverage_line(coverage: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """``rollout: 1 of 2 workers recorded; training: 2 of 2`` (None when nothing is known)."""
    parts = [f"{side}: {c['recorded']} of {c['expected'] if c['expected'] is not None else '?'} workers recorded"
             for side, c in coverage.items()]
    return "; ".join(parts) or None


def _side_missing(side: str, expected: Optional[Mapping[str, Any]], strict: bool) -> Finding:
    """No worker of ``side`` wrote: a warning; an error in strict mode when the config says how many should have."""
    count = (expected or {}).get("count")
    what = f"{side}: 0 of {count} workers recorded ({expected['how']})" if count else f"no {side} worker wrote a record"
    return Finding(Code.SIDE_MISSING.value, Severity.ERROR if strict and count else Severity.WARNING, f"workers.{side}", count,
                   f"{what}: nothing to bind, the {side} side was not checked",
                   f"check that the {side} workers started with the plugin active (their log names the hook that did not attach)")


def build_report(
    records: Mapping[str, Any],
    *,
    mandate: Optional[Mandate],
    allow_dtype_difference: bool = False,
    on_mismatch: str = "warn",
    expected: Iterable[str] = (),
    collective: Optional[str] = "auto",
    absent_sides: Optional[Mapping[str, str]] = None,
    expected_counts: Optional[Mapping[str, Mapping[str, Any]]] = None,
    strict: bool = False,
) -> dict[str, Any]:
    """The report document for ``read_worker_records``' result (see docs/report-schema.md).

    ``expected``: worker ids that should have written, besides the ``peers`` the host details
    name (missing ones are listed); ``collective``: the NCCL collective that reduces the compared
    tensor, ``None``, or ``auto`` (``allreduce`` when some worker has tp_size > 1);
    ``absent_sides``: side -> why this run has none (e.g. SFT has no rollout side): stated, not
    counted as a missing side; ``expected_counts``: side -> ``{"count", "ids", "how"}``
    (``expected_workers.ExpectedSide.to_dict()``), the workers the config starts: the report says
    "k of N workers recorded" and a side with 0 of N is a warning (an error when ``strict``; without
    N, no record on a side stays a warning)."""
    absent_sides = dict(absent_sides or {})
    expected_counts = {side: dict(e) for side, e in (expected_counts or {}).items() if side not in absent_sides}
    details = records.get("details", {})
    contracts = [c for c, _ in records["records"]]
    probes = {(c.side, c.worker_id): p for c, p in records["records"]}
    by_side = {side: [c for c in contracts if c.side == side] for side in SIDES}
    found = [c.worker_id for c in contracts]
    expected = set(expected) | {peer for d in details.values() for peer in d.get("peers") or [] if isinstance(peer, str)}
    expected |= {worker for e in expected_counts.values() for worker in e.get("ids") or ()}
    missing = sorted(expected - set(found))
    findings: list[Finding] = []
    for worker in missing:
        findings.append(Finding(Code.WORKER_MISSING.value, Severity.WARNING, f"workers.{worker}", None,
                                f"worker {worker} wrote no record (it may have died before its engine was up)",
                                "check that worker's log; the binding below covers only the workers that wrote"))
    for bad in records["unreadable"]:
        findings.append(Finding(Code.RECORD_UNREADABLE.value, Severity.WARNING, "workers.record", bad["path"],
                                f"unreadable worker file: {bad['error']}", "remove the file or rerun that worker"))
    not_applicable = {side: why for side, why in absent_sides.items() if not by_side.get(side)}
    for side, members in by_side.items():
        for other in members[1:]:
            findings.extend(_divergences(members[0], other))
        if side in not_applicable:
            findings.append(Finding(Code.SIDE_ABSENT.value, Severity.INFO, f"workers.{side}", None,
                                    f"no {side} side: {not_applicable[side]}; the training/rollout binding is not applicable",
                                    "nothing to fix: this run records one side only"))
        elif not members:
            findings.append(_side_missing(side, expected_counts.get(side), strict))
    findings.extend(_detail_findings(details))
    binding = None
    if by_side["training"] and by_side["rollout"]:
        training, rollout = by_side["training"][0], by_side["rollout"][0]
        coll = collective_for(training.known_value("tp_size"), rollout.known_value("tp_size")) if collective == "auto" else collective
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
    stages = {side: {wid: d.get("stage") for (s, wid), d in sorted(details.items()) if s == side} for side in SIDES}
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "created_at": _now(),
        "collected_at": None,
        "run_id": None,
        "verdict": verdict.value,
        "binding_applicable": not not_applicable,
        "settings": {
            "on_mismatch": on_mismatch,
            "allow_dtype_difference": allow_dtype_difference,
            "mandate": mandate.to_dict() if mandate is not None else None,
        },
        "workers": {
            "expected": sorted(expected),
            "found": found,
            "missing": missing,
            "stages": stages,
            "unreadable": list(records["unreadable"]),
            "incomplete_writes": list(records["incomplete_writes"]),
            "stale": list(records.get("stale", [])),
            "coverage": side_coverage(by_side, expected_counts, _peers_by_side(details)),
        },
        "contracts": [c.to_dict() for c in contracts],
        "determinism_probes": {side: {wid: (p.to_dict() if p is not None else None) for (s, wid), p in probes.items() if s == side}
                               for side in SIDES},
        "binding": binding_dict,
        "findings": all_findings,
        "drift": {"metrics": dict(DRIFT_METRICS), "steps": []},
        "history": [],
    }


def collect(report_dir: PathLike, *, run_id: Optional[str] = None, **options: Any) -> dict[str, Any]:
    """Read every worker file under ``report_dir`` (of run ``run_id`` only, when given) and build
    the report document (writes nothing); ``options`` are ``build_report``'s."""
    doc = build_report(read_worker_records(report_dir, run_id), **options)
    doc["run_id"] = run_id
    return doc


def write_report(report_dir: PathLike, doc: Mapping[str, Any]) -> Path:
    """Write the report document to ``<report_dir>/attention_align_report.json`` atomically."""
    return atomic_write_json(Path(report_dir) / REPORT_FILENAME, doc)


_REQUIRED_KEYS = ("schema_version", "kind", "verdict", "settings", "workers", "contracts", "binding", "findings", "drift")


#: The type each top-level section of a report must have.
_SECTION_TYPES = {"settings": dict, "workers": dict, "contracts": list, "binding": (dict, type(None)), "findings": list, "drift": dict}


def _check_report(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != REPORT_KIND:
        raise ReportError(f"{where}: not a nemo-rl-attn-align report (expected kind {REPORT_KIND!r})")
    if not _schema_version_ok(doc):
        version = str(doc.get("schema_version"))[:40]
        raise ReportError(f"{where}: report schema_version {version}; this version reads {REPORT_SCHEMA_VERSION} (an integer)")
    missing = [key for key in _REQUIRED_KEYS if key not in doc]
    if missing:
        raise ReportError(f"{where}: report lacks {', '.join(missing)}")
    if not isinstance(doc["verdict"], str) or doc["verdict"] not in {v.value for v in Verdict}:
        raise ReportError(f"{where}: verdict {str(doc['verdict'])[:40]!r} is not one of pass, incomparable, fail")
    wrong = [key for key, kind in _SECTION_TYPES.items() if not isinstance(doc[key], kind)]
    if wrong:
        raise ReportError(f"{where}: report section {wrong[0]} is {type(doc[wrong[0]]).__name__}; the report is malformed")
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
                doc = collect(path, mandate=Mandate())
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
    return _check_report(doc, where)


def _drift_name(name: str) -> str:
    key = name.removeprefix("training/")
    if key not in DRIFT_METRICS:
        raise ValueError(f"unknown drift metric {name!r}; known: {', '.join(DRIFT_METRICS)}")
    return key


def add_drift(doc: dict[str, Any], step: int, metrics: Mapping[str, float]) -> dict[str, Any]:
    """Add (or replace) the drift figures of ``step`` in the report document ``doc`` (in memory:
    the driver then writes it with ``write_report``; ``ValueError`` and ``doc`` untouched on a bad
    step, name or value). Names are ``DRIFT_METRICS`` keys; verl's ``training/`` prefix is accepted."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    entry: dict[str, Any] = {"step": step}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"drift metric {name} must be a finite number, got {value!r}")
        entry[_drift_name(name)] = float(value)
    steps = [s for s in doc["drift"]["steps"] if s.get("step") != step] + [entry]
    doc["drift"]["steps"] = sorted(steps, key=lambda s: s["step"])
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
    lines = [format_finding(f) for f in findings if f["severity"] in shown]
    hidden = sum(f["severity"] not in shown for f in findings)
    if hidden:
        lines.append(f"(+{hidden} more findings of severity other than {'/'.join(shown)} in the JSON)")
    return lines


def _worker_list(doc: Mapping[str, Any], side: str) -> list[str]:
    stages = doc["workers"].get("stages", {}).get(side, {})
    return [f"{c['worker_id']} [{stages[c['worker_id']]}]" if stages.get(c["worker_id"]) else c["worker_id"]
            for c in doc["contracts"] if c["side"] == side]


def render_summary(doc: Mapping[str, Any], full: bool = False) -> str:
    """The human summary of a report document (``full``: every field and variable)."""
    workers = doc["workers"]
    point = f"; collected at {doc['collected_at']}" if doc.get("collected_at") else ""
    sides = [f"{side} {', '.join(names)}" for side in SIDES if (names := _worker_list(doc, side))]
    stale = f"; stale files of other runs: {len(workers['stale'])}" if workers.get("stale") else ""
    lines = [
        f"nemo-rl-attn-align report: verdict {doc['verdict'].upper()} (on_mismatch: {doc['settings']['on_mismatch']}{point})",
        "workers: " + "; ".join(sides or ["none recorded"])
        + f"; missing: {', '.join(workers['missing']) or 'none'}; unreadable: {len(workers['unreadable'])}"
        + f"; incomplete writes: {len(workers['incomplete_writes'])}{stale}",
    ]
    coverage = coverage_line(workers.get("coverage") or {})
    if coverage:
        lines.append(coverage)
    lines.extend(f["message"] for f in doc["findings"] if f["code"] == Code.SIDE_ABSENT.value)
    preset = doc["settings"].get("preset")
    if preset:
        changed = ", ".join(f"{c['key']}={c['value']!r}" for c in preset["changes"]) or "nothing"
        lines.append(f"preset aligned changed: {changed}")
        if preset.get("refusal"):
            lines.append(f"preset aligned could not align: {format_finding(preset['refusal'])}")
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


def _finding_key(finding: Mapping[str, Any]) -> tuple:
    return finding["code"], finding["key"], finding["message"]


def render_changes(previous: Mapping[str, Any], doc: Mapping[str, Any]) -> list[str]:
    """What a later collection of the same run changed: the verdict, workers that came or went,
    new error/warning findings, findings that no longer apply. Empty when nothing changed."""
    lines = []
    if previous["verdict"] != doc["verdict"]:
        lines.append(f"verdict {previous['verdict'].upper()} -> {doc['verdict'].upper()}")
    for label, key in (("now recorded", "found"), ("now missing", "missing")):
        came = sorted(set(doc["workers"][key]) - set(previous["workers"][key]))
        if came:
            lines.append(f"workers {label}: {', '.join(came)}")
    before, after = {_finding_key(f) for f in previous["findings"]}, {_finding_key(f) for f in doc["findings"]}
    fresh = [f for f in doc["findings"] if _finding_key(f) not in before and f["severity"] != Severity.INFO.value]
    lines.extend(f"new: {line}" for line in render_findings(fresh))
    gone = len(before - after)
    if gone:
        lines.append(f"{gone} earlier finding(s) no longer apply")
    return lines


def _announcement(doc: Mapping[str, Any], previous: Optional[Mapping[str, Any]], path: Path, final: bool) -> Optional[str]:
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
        return "\n".join([f"attention_align ({point}): the report changed since {previous.get('collected_at')}:"]
                         + [f"  {line}" for line in changes] + [f"report updated: {path}"])
    if final:
        return f"attention_align ({point}): verdict {verdict}, unchanged since {previous.get('collected_at')}; report: {path}"
    return None


def raise_for_mismatch(doc: Mapping[str, Any]) -> None:
    """``on_mismatch: error`` and verdict ``fail``: raise ``AttentionMismatch`` with the error findings."""
    if doc["settings"]["on_mismatch"] == "error" and doc["verdict"] == Verdict.FAIL.value:
        errors = [Finding(f["code"], Severity(f["severity"]), f["key"], f["value"], f["message"], f["fix"])
                  for f in doc["findings"] if f["severity"] == Severity.ERROR.value]
        raise AttentionMismatch(errors)


def finalize(
    settings: Any,
    *,
    report_dir: Optional[PathLike] = None,
    expected: Iterable[str] = (),
    collective: Optional[str] = "auto",
    printer: Callable[[str], None] = print,
    absent_sides: Optional[Mapping[str, str]] = None,
    run_id: Optional[str] = None,
    previous: Optional[Mapping[str, Any]] = None,
    point: str = "setup",
    final: bool = False,
    enforce: bool = True,
    preset: Optional[Mapping[str, Any]] = None,
    expected_counts: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> dict[str, Any]:
    """Driver side: collect, bind, write the report, print what is new, enforce ``on_mismatch``.

    ``settings`` is ``settings.AlignSettings`` (``on_mismatch``, ``allow_dtype_difference``,
    ``to_mandate()``, ``report_dir``); ``report_dir`` overrides ``settings.report_dir`` (the
    driver passes the experiment's real log dir); ``run_id`` leaves out files of other runs;
    ``absent_sides`` as ``build_report``; ``point`` names the moment (``setup``, ``first_step``,
    ...), ``previous`` is the document an earlier call of this run returned (its drift figures and
    history are kept); ``final`` marks the run's last collection; ``preset`` is what
    ``attention_align.preset`` changed, kept under ``settings.preset``; ``expected_counts`` as
    ``build_report`` (with ``settings.strict``, a side with 0 of N workers is an error finding).

    Printed, at most one message per call: the first time, the summary (``record``: one line with
    the path; ``final``: one line, e.g. after a failed setup); later, what changed, if anything
    (``record``: nothing); at the final call, one line with the verdict and the path when nothing
    changed. ``enforce`` and ``on_mismatch: error`` and verdict ``fail``: ``AttentionMismatch``,
    raised after the report is written and printed."""
    folder = Path(report_dir if report_dir is not None else settings.report_dir)
    doc = collect(folder, run_id=run_id, mandate=settings.to_mandate(), allow_dtype_difference=settings.allow_dtype_difference,
                  on_mismatch=settings.on_mismatch, expected=expected, collective=collective, absent_sides=absent_sides,
                  expected_counts=expected_counts, strict=bool(getattr(settings, "strict", False)))
    doc["collected_at"] = point
    doc["settings"]["preset"] = dict(preset) if preset is not None else None
    if previous is not None:
        doc["drift"]["steps"] = list(previous["drift"]["steps"])
        doc["history"] = list(previous.get("history", []))
    doc["history"].append({"point": point, "created_at": doc["created_at"], "verdict": doc["verdict"]})
    path = write_report(folder, doc)
    message = _announcement(doc, previous, path, final)
    if message is not None:
        printer(message)
    if enforce:
        raise_for_mismatch(doc)
    return doc
