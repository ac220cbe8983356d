"""The report document: every worker's files collected into one JSON document that binds the
training side's attention contract to the rollout side's.

``collect`` reads the worker files (``store.read_worker_files``) and ``build_report`` binds them:
a worker that died leaves a gap (its expected id is listed as missing), unreadable, incomplete and
stale files are listed; none of them stops the collection. ``write_report`` writes
``<report_dir>/attention_align_report.json`` atomically (``load.load_report`` reads and checks
one); who was expected, found and missing, and the findings about them, come from ``workers.py``.
``drift_entry`` checks a step's drift figures (``drift_log`` appends them while a run goes on;
``add_drift`` adds them in memory). The document's schema is ``docs/report-schema.md``.
Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.binding.binding import BindingReport, Verdict, bind
from nemo_rl_attn_align.binding.determinism import DeterminismProbe, collective_for, compare
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.contract.contract import AttentionContract, contract_dicts
from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide
from nemo_rl_attn_align.report import workers
from nemo_rl_attn_align.report.drift_log import drift_log_path, read_steps
from nemo_rl_attn_align.report.store import (
    REPORT_SCHEMA_VERSION,
    PathLike,
    atomic_write_json,
    now_iso,
    read_worker_files,
)
from nemo_rl_attn_align.report.worker_files import WorkerFiles
from nemo_rl_attn_align.vocab.codes import Code, Kind, Severity
from nemo_rl_attn_align.vocab.errors import Finding
from nemo_rl_attn_align.vocab.names import DRIFT_METRICS
from nemo_rl_attn_align.vocab.schema import SIDES

REPORT_KIND = "nemo-rl-attn-align/report"
REPORT_FILENAME = "attention_align_report.json"


@dataclass(frozen=True)
class RunDescription:
    """One run as its report sees it, besides the settings.

    ``run_id``: only this run's files are read (None: every file); ``expected``: side ->
    ``expected_workers.ExpectedSide``, the workers the config starts (missing ones are listed,
    "k of N workers recorded"; a side with 0 of N is a warning, an error with ``settings.strict``);
    ``absent_sides``: side -> why this run has none (e.g. SFT has no rollout side): stated, not
    counted as missing; ``collective``: the NCCL collective that reduces the compared tensor,
    ``None``, or ``auto`` (``allreduce`` when some worker has tp_size > 1); ``preset``: what
    ``attention_align.preset`` changed; ``attention_only``: the run's attention-only drift estimate
    (``drift.estimate``). The last two are ``finalize``'s, kept in the run's report."""

    run_id: str | None = None
    expected: Mapping[str, ExpectedSide] = field(default_factory=dict)
    absent_sides: Mapping[str, str] = field(default_factory=dict)
    collective: str | None = "auto"
    preset: Mapping[str, Any] | None = None
    attention_only: Mapping[str, Any] | None = None


def _bind_sides(
    by_side: Mapping[str, list[AttentionContract]],
    probes: Mapping[tuple[str, str], DeterminismProbe | None],
    settings: AlignSettings,
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
    return bind(
        training,
        rollout,
        settings.mandate,
        allow_dtype_difference=settings.allow_dtype_difference,
        determinism=diff,
    )


def _verdict(binding: BindingReport | None, findings: list[Finding], incomplete: bool) -> Verdict:
    """``fail`` when workers of a side diverge or a worker's hook found an error in its host (e.g.
    ``PACKED_BOUNDARIES_DROPPED``); a pass with missing or unreadable workers (``incomplete``) is
    ``incomparable``; else the binding's verdict (``incomparable`` without one)."""
    if any(
        f.code is Code.REPORT_WORKER_DIVERGES or (f.code.kind is Kind.HOST and f.severity is Severity.ERROR)
        for f in findings
    ):
        return Verdict.FAIL
    if binding is None:
        return Verdict.INCOMPARABLE
    if binding.verdict is Verdict.PASS and incomplete:
        return Verdict.INCOMPARABLE
    return binding.verdict


def _settings_section(settings: AlignSettings) -> dict[str, Any]:
    return {
        "on_mismatch": settings.on_mismatch.to_dict(),
        "allow_dtype_difference": settings.allow_dtype_difference,
        "mandate": settings.mandate.to_dict(),
    }


def _probes_section(probes: Mapping[tuple[str, str], DeterminismProbe | None]) -> dict[str, Any]:
    """Side -> worker id -> its determinism probe (None where the worker read none)."""
    shared: dict[int, dict[str, Any]] = {}  # workers that share one probe (read from one template) share its dict

    def as_dict(probe: DeterminismProbe | None) -> dict[str, Any] | None:
        if probe is None:
            return None
        if id(probe) not in shared:
            shared[id(probe)] = probe.to_dict()
        return shared[id(probe)]

    return {side: {wid: as_dict(p) for (s, wid), p in probes.items() if s == side} for side in SIDES}


def build_report(files: WorkerFiles, settings: AlignSettings, run: RunDescription = RunDescription()) -> dict[str, Any]:
    """The report document for the worker files of one run (see docs/report-schema.md): bound with
    ``settings`` (``mandate``, ``allow_dtype_difference``, ``on_mismatch``, ``strict``), who was
    expected and why a side is absent from ``run``."""
    absent_sides = dict(run.absent_sides)
    expected = {side: e for side, e in run.expected.items() if side not in absent_sides}
    contracts = [record.contract for record in files.records]
    probes = files.probes()
    by_side = {side: files.contracts(side) for side in SIDES}
    found = [c.worker_id for c in contracts]
    expected_ids = workers.expected_ids(files, expected)
    missing = sorted(expected_ids - set(found))
    not_applicable = {side: why for side, why in absent_sides.items() if not by_side.get(side)}
    findings = (
        workers.file_findings(missing, files.unreadable)
        + workers.side_findings(by_side, not_applicable, expected, settings.strict)
        + workers.detail_findings(files.details)
    )
    binding = _bind_sides(by_side, probes, settings, run.collective)
    verdict = _verdict(binding, findings, bool(missing or files.unreadable))
    binding_dict = binding.to_dict() if binding is not None else None
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "created_at": now_iso(),
        "collected_at": None,
        "run_id": None,
        "verdict": verdict.value,
        "binding_applicable": not not_applicable,
        "settings": _settings_section(settings),
        "workers": workers.section(files, expected_ids, found, missing, by_side, expected),
        "contracts": contract_dicts(contracts),
        "determinism_probes": _probes_section(probes),
        "binding": binding_dict,
        "findings": (binding_dict["findings"] if binding_dict else []) + [f.to_dict() for f in findings],
        "drift": {"metrics": dict(DRIFT_METRICS), "steps": []},
        "history": [],
    }


def collect(report_dir: PathLike, settings: AlignSettings, run: RunDescription = RunDescription()) -> dict[str, Any]:
    """Read every worker file under ``report_dir`` (of ``run.run_id`` only, when given) and build
    the report document (writes nothing)."""
    doc = build_report(read_worker_files(report_dir, run.run_id), settings, run)
    doc["run_id"] = run.run_id
    return doc


def write_report(report_dir: PathLike, doc: Mapping[str, Any]) -> Path:
    """Write the report document to ``<report_dir>/attention_align_report.json`` atomically."""
    return atomic_write_json(Path(report_dir) / REPORT_FILENAME, doc)


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
