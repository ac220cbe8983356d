"""The report document: every worker's files collected into one JSON document that binds the
training side's attention contract to the rollout side's.

``collect`` reads the worker files (``store.read_worker_records``) and ``build_report`` binds them:
a worker that died leaves a gap (its expected id is listed as missing), unreadable, incomplete and
stale files are listed; none of them stops the collection. ``write_report`` writes
``<report_dir>/attention_align_report.json`` atomically, ``load_report`` reads and checks one,
``drift_entry`` checks a step's drift figures (``drift_log`` appends them while a run goes on;
``add_drift`` adds them in memory). The document's schema is ``docs/report-schema.md``.
Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.codes import Code
from nemo_rl_attn_align.compare.binding import BindingReport, Mandate, Verdict, bind, same_value
from nemo_rl_attn_align.compare.determinism import DeterminismProbe, collective_for, compare
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.contract.schema import SIDES, Tier, field_spec, fields_of
from nemo_rl_attn_align.errors import Finding, Severity
from nemo_rl_attn_align.limits import MAX_REPORT_BYTES, InputRefused, shown_path
from nemo_rl_attn_align.report.drift_log import drift_log_path, read_steps
from nemo_rl_attn_align.report.store import (
    HOSTS_DIR,
    REPORT_SCHEMA_VERSION,
    WORKERS_DIR,
    PathLike,
    atomic_write_json,
    now_iso,
    read_json_file,
    read_worker_records,
    schema_version_ok,
    worker_detail_path,
)

REPORT_KIND = "nemo-rl-attn-align/report"
REPORT_FILENAME = "attention_align_report.json"

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


class ReportError(Exception):
    """A report that cannot be read; ``str(err)`` is one line naming the file and what is wrong."""


def _divergences(representative: AttentionContract, other: AttentionContract) -> list[Finding]:
    """Identity/semantic fields where a worker disagrees with the first worker of its side."""
    out = []
    for name in fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC):
        a, b = representative[name], other[name]
        if a.known and b.known and not same_value(a.value, b.value):
            out.append(
                Finding(
                    Code.WORKER_DIVERGES.value,
                    Severity.ERROR,
                    f"contract.{field_spec(name).tier.value}.{name}",
                    f"{representative.worker_id}={a.value!r}, {other.worker_id}={b.value!r}",
                    f"{other.side} worker {other.worker_id} disagrees with {representative.worker_id} on {name}",
                    f"every {other.side} worker must run the same attention; check per-rank overrides",
                )
            )
    return out


def _detail_findings(details: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Finding]:
    """What the host hooks noticed (e.g. Transformer Engine ran another backend than requested)."""
    out = []
    for (side, worker_id), detail in sorted(details.items()):
        for problem in detail.get("findings") or []:
            out.append(
                Finding(
                    Code.WORKER_FINDING.value,
                    Severity.WARNING,
                    f"workers.{worker_id}",
                    detail.get("stage"),
                    f"{side} worker {worker_id} ({detail.get('host', 'hook')}): {problem}",
                    f"see {HOSTS_DIR}/{worker_detail_path('.', side, worker_id).name} for what the hook saw; "
                    "attention_align.strict: true stops the run on such a finding",
                )
            )
    return out


def side_coverage(
    by_side: Mapping[str, list], expected_counts: Mapping[str, Mapping[str, Any]], peers: Mapping[str, set] = {}
) -> dict[str, Any]:
    """Side -> ``{"recorded": k, "expected": N or None, "how": ...}`` for each side the config
    starts workers for (``expected_counts``) or that some worker recorded; without the config's
    count, N is the number of ids the side's host details name as ``peers`` (None when none do)."""
    coverage = {}
    for side in SIDES:
        expected = dict(expected_counts.get(side) or {})
        if not expected and not by_side.get(side):
            continue
        if not expected and peers.get(side):
            expected = {
                "count": len(peers[side]),
                "ids": sorted(peers[side]),
                "how": "the peers the workers' host details name",
            }
        ids = set(expected.get("ids") or ())
        recorded = [c.worker_id for c in by_side.get(side, [])]
        coverage[side] = {
            "recorded": len([w for w in recorded if w in ids]) if ids else len(recorded),
            "expected": expected.get("count"),
            "how": expected.get("how") or "not derived from the config",
        }
    return coverage


def _peers_by_side(details: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, set]:
    peers: dict[str, set] = {}
    for (side, _), detail in details.items():
        peers.setdefault(side, set()).update(p for p in detail.get("peers") or [] if isinstance(p, str))
    return peers


def _side_missing(side: str, expected: Mapping[str, Any] | None, strict: bool) -> Finding:
    """No worker of ``side`` wrote: a warning; an error in strict mode when the config says how many should have."""
    count = (expected or {}).get("count")
    what = (
        f"{side}: 0 of {count} workers recorded ({expected['how']})"
        if expected and count
        else f"no {side} worker wrote a record"
    )
    return Finding(
        Code.SIDE_MISSING.value,
        Severity.ERROR if strict and count else Severity.WARNING,
        f"workers.{side}",
        count,
        f"{what}: nothing to bind, the {side} side was not checked",
        f"check that the {side} workers started with the plugin active (their log names the hook that did not attach)",
    )


def _expected_ids(
    expected: Iterable[str],
    details: Mapping[tuple[str, str], Mapping[str, Any]],
    expected_counts: Mapping[str, Mapping[str, Any]],
) -> set[str]:
    """The worker ids that should have written: ``expected``, the host details' ``peers`` and the config's ids."""
    ids = set(expected) | {peer for d in details.values() for peer in d.get("peers") or [] if isinstance(peer, str)}
    return ids | {worker for e in expected_counts.values() for worker in e.get("ids") or ()}


def _file_findings(missing: list[str], unreadable: list[Mapping[str, Any]]) -> list[Finding]:
    """A worker that wrote no record, a worker file that could not be read."""
    findings = [
        Finding(
            Code.WORKER_MISSING.value,
            Severity.WARNING,
            f"workers.{worker}",
            None,
            f"worker {worker} wrote no record (it may have died before its engine was up)",
            "check that worker's log; the binding below covers only the workers that wrote",
        )
        for worker in missing
    ]
    findings += [
        Finding(
            Code.RECORD_UNREADABLE.value,
            Severity.WARNING,
            "workers.record",
            bad["path"],
            f"unreadable worker file: {bad['error']}",
            "remove the file or rerun that worker",
        )
        for bad in unreadable
    ]
    return findings


def _side_findings(
    by_side: Mapping[str, list[AttentionContract]],
    not_applicable: Mapping[str, str],
    expected_counts: Mapping[str, Mapping[str, Any]],
    strict: bool,
) -> list[Finding]:
    """Per side: workers that diverge from its first worker, then a side this run has none of
    (stated) or a side no worker recorded (``_side_missing``)."""
    findings: list[Finding] = []
    for side, members in by_side.items():
        for other in members[1:]:
            findings.extend(_divergences(members[0], other))
        if side in not_applicable:
            findings.append(
                Finding(
                    Code.SIDE_ABSENT.value,
                    Severity.INFO,
                    f"workers.{side}",
                    None,
                    f"no {side} side: {not_applicable[side]}; the training/rollout binding is not applicable",
                    "nothing to fix: this run records one side only",
                )
            )
        elif not members:
            findings.append(_side_missing(side, expected_counts.get(side), strict))
    return findings


def _bind_sides(
    by_side: Mapping[str, list[AttentionContract]],
    probes: Mapping[tuple[str, str], DeterminismProbe | None],
    mandate: Mandate | None,
    allow_dtype_difference: bool,
    collective: str | None,
) -> BindingReport | None:
    """The first training worker bound to the first rollout worker (None without both sides)."""
    if not (by_side["training"] and by_side["rollout"]):
        return None
    training, rollout = by_side["training"][0], by_side["rollout"][0]
    if collective == "auto":
        collective = collective_for(training.known_value("tp_size"), rollout.known_value("tp_size"))
    t_probe, r_probe = probes[("training", training.worker_id)], probes[("rollout", rollout.worker_id)]
    diff = compare(t_probe, r_probe, collective) if t_probe is not None and r_probe is not None else None
    return bind(training, rollout, mandate, allow_dtype_difference=allow_dtype_difference, determinism=diff)


def _verdict(binding: BindingReport | None, findings: list[Finding], incomplete: bool) -> Verdict:
    """``fail`` when workers of a side diverge; a pass with missing or unreadable workers
    (``incomplete``) is ``incomparable``; else the binding's verdict (``incomparable`` without one)."""
    diverges = any(f.code == Code.WORKER_DIVERGES.value for f in findings)
    if binding is None:
        return Verdict.FAIL if diverges else Verdict.INCOMPARABLE
    if diverges:
        return Verdict.FAIL
    if binding.verdict is Verdict.PASS and incomplete:
        return Verdict.INCOMPARABLE
    return binding.verdict


def _workers_section(
    records: Mapping[str, Any],
    expected: set[str],
    found: list[str],
    missing: list[str],
    by_side: Mapping[str, list[AttentionContract]],
    expected_counts: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The document's ``workers`` section: who was expected, found, missing; stages, bad files, coverage."""
    details = records.get("details", {})
    return {
        "expected": sorted(expected),
        "found": found,
        "missing": missing,
        "stages": {
            side: {wid: d.get("stage") for (s, wid), d in sorted(details.items()) if s == side} for side in SIDES
        },
        "unreadable": list(records["unreadable"]),
        "incomplete_writes": list(records["incomplete_writes"]),
        "stale": list(records.get("stale", [])),
        "coverage": side_coverage(by_side, expected_counts, _peers_by_side(details)),
    }


def build_report(
    records: Mapping[str, Any],
    *,
    mandate: Mandate | None,
    allow_dtype_difference: bool = False,
    on_mismatch: str = "warn",
    expected: Iterable[str] = (),
    collective: str | None = "auto",
    absent_sides: Mapping[str, str] | None = None,
    expected_counts: Mapping[str, Mapping[str, Any]] | None = None,
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
    expected_ids = _expected_ids(expected, details, expected_counts)
    missing = sorted(expected_ids - set(found))
    not_applicable = {side: why for side, why in absent_sides.items() if not by_side.get(side)}
    findings = (
        _file_findings(missing, records["unreadable"])
        + _side_findings(by_side, not_applicable, expected_counts, strict)
        + _detail_findings(details)
    )
    binding = _bind_sides(by_side, probes, mandate, allow_dtype_difference, collective)
    verdict = _verdict(binding, findings, bool(missing or records["unreadable"]))
    binding_dict = binding.to_dict() if binding is not None else None
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "created_at": now_iso(),
        "collected_at": None,
        "run_id": None,
        "verdict": verdict.value,
        "binding_applicable": not not_applicable,
        "settings": {
            "on_mismatch": on_mismatch,
            "allow_dtype_difference": allow_dtype_difference,
            "mandate": mandate.to_dict() if mandate is not None else None,
        },
        "workers": _workers_section(records, expected_ids, found, missing, by_side, expected_counts),
        "contracts": [c.to_dict() for c in contracts],
        "determinism_probes": {
            side: {wid: (p.to_dict() if p is not None else None) for (s, wid), p in probes.items() if s == side}
            for side in SIDES
        },
        "binding": binding_dict,
        "findings": (binding_dict["findings"] if binding_dict else []) + [f.to_dict() for f in findings],
        "drift": {"metrics": dict(DRIFT_METRICS), "steps": []},
        "history": [],
    }


def collect(report_dir: PathLike, *, run_id: str | None = None, **options: Any) -> dict[str, Any]:
    """Read every worker file under ``report_dir`` (of run ``run_id`` only, when given) and build
    the report document (writes nothing); ``options`` are ``build_report``'s."""
    doc = build_report(read_worker_records(report_dir, run_id), **options)
    doc["run_id"] = run_id
    return doc


def write_report(report_dir: PathLike, doc: Mapping[str, Any]) -> Path:
    """Write the report document to ``<report_dir>/attention_align_report.json`` atomically."""
    return atomic_write_json(Path(report_dir) / REPORT_FILENAME, doc)


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
    return with_logged_drift(_check_report(doc, where), path.parent)


def with_logged_drift(doc: dict[str, Any], report_dir: PathLike) -> dict[str, Any]:
    """``doc`` with ``drift.steps`` from its run's drift log in ``report_dir``, when there is one
    (the log is newer than the steps the last collection wrote)."""
    steps = read_steps(drift_log_path(report_dir, doc.get("run_id")))
    if steps is not None:
        doc["drift"]["steps"] = steps
    return doc


def _drift_name(name: str) -> str:
    key = name.removeprefix("training/")
    if key not in DRIFT_METRICS:
        raise ValueError(f"unknown drift metric {name!r}; known: {', '.join(DRIFT_METRICS)}")
    return key


def drift_entry(step: int, metrics: Mapping[str, float]) -> dict[str, Any]:
    """One step's drift entry ``{"step": step, metric: value, ...}``; ``ValueError`` on a bad step,
    name or value. Names are ``DRIFT_METRICS`` keys; verl's ``training/`` prefix is accepted."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    entry: dict[str, Any] = {"step": step}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"drift metric {name} must be a finite number, got {value!r}")
        entry[_drift_name(name)] = float(value)
    return entry


def add_drift(doc: dict[str, Any], step: int, metrics: Mapping[str, float]) -> dict[str, Any]:
    """Add (or replace) the drift figures of ``step`` in the report document ``doc`` in memory
    (``drift_entry`` checks them; ``doc`` untouched on a bad one). A running driver appends to the
    drift log instead (``drift_log.append_step``)."""
    entry = drift_entry(step, metrics)
    steps = [s for s in doc["drift"]["steps"] if s.get("step") != step] + [entry]
    doc["drift"]["steps"] = sorted(steps, key=lambda s: s["step"])
    return doc
