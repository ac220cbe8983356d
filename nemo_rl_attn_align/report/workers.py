"""What the worker files say about the workers: who was expected, who wrote, who is missing, how
much of each side recorded (``side_coverage``), and the findings about them: a worker that diverges
from the first of its side, a hook's finding, a missing or unreadable worker file, a side that wrote
nothing. ``document.build_report`` puts them in the report. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nemo_rl_attn_align.binding.binding import same_value
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide
from nemo_rl_attn_align.report.store import HOSTS_DIR, worker_detail_path
from nemo_rl_attn_align.report.worker_files import HostDetail, UnreadableFile, WorkerFiles, WorkerKey
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, Severity, finding
from nemo_rl_attn_align.vocab.schema import SIDES, NotBound, Tier, field_spec, fields_of


def _divergences(representative: AttentionContract, other: AttentionContract) -> list[Finding]:
    """Identity/semantic fields where a worker disagrees with the first worker of its side."""
    if other.fields is representative.fields:  # read from one template: the same fields
        return []
    out = []
    for name in fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC):
        a, b = representative[name], other[name]
        if a.known and b.known and not same_value(a.value, b.value):
            out.append(
                finding(
                    Code.REPORT_WORKER_DIVERGES,
                    f"contract.{field_spec(name).tier.value}.{name}",
                    f"{representative.worker_id}={a.value!r}, {other.worker_id}={b.value!r}",
                    f"{other.side} worker {other.worker_id} disagrees with {representative.worker_id} on {name}",
                    f"every {other.side} worker must run the same attention; check per-rank overrides",
                )
            )
    return out


def detail_findings(details: Mapping[WorkerKey, HostDetail]) -> list[Finding]:
    """What the host hooks noticed: each line a ``REPORT_WORKER_FINDING`` (e.g. Transformer Engine ran
    another backend than requested), each coded finding as the worker wrote it."""
    out: list[Finding] = []
    for (side, worker_id), detail in sorted(details.items()):
        out.extend(detail.coded_findings)
        for problem in detail.findings:
            out.append(
                finding(
                    Code.REPORT_WORKER_FINDING,
                    f"workers.{worker_id}",
                    detail.stage,
                    f"{side} worker {worker_id} ({detail.host or 'hook'}): {problem}",
                    f"see {HOSTS_DIR}/{worker_detail_path('.', side, worker_id).name} for what the hook saw; "
                    "attention_align.strict: true stops the run on such a finding",
                )
            )
    return out


def side_coverage(
    by_side: Mapping[str, list[AttentionContract]],
    expected_sides: Mapping[str, ExpectedSide],
    peers: Mapping[str, set[str]],
) -> dict[str, Any]:
    """Side -> ``{"recorded": k, "expected": N or None, "how": ...}`` for each side the config
    starts workers for (``expected_sides``) or that some worker recorded; without the config's
    count, N is the number of ids the side's host details name as ``peers`` (None when none do)."""
    coverage = {}
    for side in SIDES:
        expected = expected_sides.get(side)
        if expected is None and not by_side.get(side):
            continue
        if expected is None and peers.get(side):
            expected = ExpectedSide(
                len(peers[side]), tuple(sorted(peers[side])), "the peers the workers' host details name"
            )
        ids = set(expected.ids) if expected is not None else set()
        recorded = [c.worker_id for c in by_side.get(side, [])]
        coverage[side] = {
            "recorded": len([w for w in recorded if w in ids]) if ids else len(recorded),
            "expected": expected.count if expected is not None else None,
            "how": expected.how if expected is not None else "not derived from the config",
        }
    return coverage


def _side_missing(side: str, expected: ExpectedSide | None, strict: bool) -> Finding:
    """No worker of ``side`` wrote: a warning; an error in strict mode when the config says how many should have."""
    count = expected.count if expected is not None else None
    what = (
        f"{side}: 0 of {count} workers recorded ({expected.how})"
        if expected is not None and count
        else f"no {side} worker wrote a record"
    )
    return finding(
        Code.REPORT_SIDE_MISSING,
        f"workers.{side}",
        count,
        f"{what}: nothing to bind, the {side} side was not checked",
        f"check that the {side} workers started with the plugin active (their log names the hook that did not attach)",
        severity=Severity.ERROR if strict and count else Severity.WARNING,
    )


def expected_ids(files: WorkerFiles, expected: Mapping[str, ExpectedSide]) -> set[str]:
    """The worker ids that should have written: the host details' ``peers`` and the config's ids."""
    return set().union(*files.peers().values(), *(e.ids for e in expected.values()))


def file_findings(missing: list[str], unreadable: Iterable[UnreadableFile]) -> list[Finding]:
    """A worker that wrote no record, a worker file that could not be read."""
    findings = [
        finding(
            Code.REPORT_WORKER_MISSING,
            f"workers.{worker}",
            None,
            f"worker {worker} wrote no record (it may have died before its engine was up)",
            "check that worker's log; the binding below covers only the workers that wrote",
        )
        for worker in missing
    ]
    findings += [
        finding(
            Code.REPORT_RECORD_UNREADABLE,
            "workers.record",
            bad.path,
            f"unreadable worker file: {bad.error}",
            "remove the file or rerun that worker",
        )
        for bad in unreadable
    ]
    return findings


def _not_bound(side: str, why: str, strict: bool) -> Finding:
    return finding(
        Code.REPORT_ROLLOUT_NOT_BOUND,
        f"workers.{side}",
        None,
        f"{side} side not bound: {why}; the training/rollout binding is not applicable",
        "use policy.generation.backend vllm or megatron to bind the rollout side"
        + ("" if strict else ", or accept a training-only record"),
        severity=Severity.ERROR if strict else Severity.WARNING,
    )


def side_findings(
    by_side: Mapping[str, list[AttentionContract]],
    not_applicable: Mapping[str, str],
    expected_sides: Mapping[str, ExpectedSide],
    strict: bool,
) -> list[Finding]:
    """Per side: workers that diverge from its first worker, then a side this run has none of
    (stated) or a side no worker recorded (``_side_missing``)."""
    findings: list[Finding] = []
    for side, members in by_side.items():
        for other in members[1:]:
            findings.extend(_divergences(members[0], other))
        if isinstance(not_applicable.get(side), NotBound):
            findings.append(_not_bound(side, not_applicable[side], strict))
        elif side in not_applicable:
            findings.append(
                finding(
                    Code.REPORT_SIDE_ABSENT,
                    f"workers.{side}",
                    None,
                    f"no {side} side: {not_applicable[side]}; the training/rollout binding is not applicable",
                    "nothing to fix: this run records one side only",
                )
            )
        elif not members:
            findings.append(_side_missing(side, expected_sides.get(side), strict))
    return findings


def section(
    files: WorkerFiles,
    expected: set[str],
    found: list[str],
    missing: list[str],
    by_side: Mapping[str, list[AttentionContract]],
    expected_sides: Mapping[str, ExpectedSide],
) -> dict[str, Any]:
    """The document's ``workers`` section: who was expected, found, missing; stages, bad files, coverage."""
    return {
        "expected": sorted(expected),
        "found": found,
        "missing": missing,
        "stages": {
            side: {wid: d.stage for (s, wid), d in sorted(files.details.items()) if s == side} for side in SIDES
        },
        "unreadable": [bad.to_dict() for bad in files.unreadable],
        "incomplete_writes": list(files.incomplete_writes),
        "stale": list(files.stale),
        "coverage": side_coverage(by_side, expected_sides, files.peers()),
    }
