"""The report rendered for humans: the summary, the binding table, findings, what changed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.binding.binding import Status
from nemo_rl_attn_align.config.settings import OnMismatch
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Severity, format_finding
from nemo_rl_attn_align.vocab.schema import SIDES

_TAGS = {"observed": "obs", "configured": "cfg", "unobservable": "unobs", "pending": "pending"}


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain left-aligned text table."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
        for row in [headers, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def coverage_line(coverage: Mapping[str, Mapping[str, Any]]) -> str | None:
    """``rollout: 1 of 2 workers recorded; training: 2 of 2`` (None when nothing is known)."""
    parts = [
        f"{side}: {c['recorded']} of {c['expected'] if c['expected'] is not None else '?'} workers recorded"
        for side, c in coverage.items()
    ]
    return "; ".join(parts) or None


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
        rows.append(
            [
                r["field"],
                r["tier"],
                status,
                _side_cell(r["training"]),
                _side_cell(r["rollout"]),
                "" if r["mandate"] is None else _short(r["mandate"]),
            ]
        )
    lines = [
        f"binding {binding['training_worker']} <-> {binding['rollout_worker']}: {binding['summary']}",
        f"passed: {str(binding['passed']).lower()}, comparable: {str(binding['comparable']).lower()}",
    ]
    if matched:
        lines.append(f"match on both sides ({len(matched)}): {', '.join(matched)}")
    if rows:
        lines.append(format_table(["field", "tier", "status", "training", "rollout", "mandate"], rows))
    lines += _pair_line(binding.get("kernel_pair"))
    det = binding.get("determinism")
    if det is not None:
        hidden = ("match", "not_probed") if not full else ()
        rows = [
            [
                e["name"],
                e["tier"],
                e["status"].upper() if e["status"] == "mismatch" else e["status"],
                _det_cell(e, "training"),
                _det_cell(e, "rollout"),
                e["note"],
            ]
            for e in det["entries"]
            if e["status"] not in hidden
        ]
        lines.append(
            f"determinism (collective: {det['collective'] or 'none reduces the compared tensor'}; "
            f"torch flags: training {det['training_torch_status']}, rollout {det['rollout_torch_status']}):"
        )
        lines.append(
            format_table(["variable", "tier", "status", "training", "rollout", "note"], rows)
            if rows
            else "  no variable or flag differs"
        )
    return "\n".join(lines)


#: ``KernelPair.one_generation`` in words.
_GENERATIONS = {True: "one flash-attn generation", False: "not one flash-attn generation", None: "not known"}


def _pair_line(pair: Mapping[str, Any] | None) -> list[str]:
    """The kernel pair the records name, in one line."""
    if pair is None:
        return []
    gpus = {g for g in pair["gpu"].values() if g}
    on = f" on {', '.join(sorted(gpus))}" if gpus else ""
    how = _GENERATIONS[pair["one_generation"]]
    return [f"kernels{on}: training {pair['training']}, rollout {pair['rollout']}: {how}"]


def render_findings(findings: list[Mapping[str, Any]], shown: tuple[str, ...] = ("error", "warning")) -> list[str]:
    """One line per finding (dicts) of the ``shown`` severities, then a count of the others."""
    lines = [format_finding(f) for f in findings if f["severity"] in shown]
    hidden = sum(f["severity"] not in shown for f in findings)
    if hidden:
        lines.append(f"(+{hidden} more findings of severity other than {'/'.join(shown)} in the JSON)")
    return lines


def _worker_list(doc: Mapping[str, Any], side: str) -> list[str]:
    stages = doc["workers"].get("stages", {}).get(side, {})
    return [
        f"{c['worker_id']} [{stages[c['worker_id']]}]" if stages.get(c["worker_id"]) else c["worker_id"]
        for c in doc["contracts"]
        if c["side"] == side
    ]


def render_summary(doc: Mapping[str, Any], full: bool = False) -> str:
    """The human summary of a report document (``full``: every field and variable)."""
    workers = doc["workers"]
    point = f"; collected at {doc['collected_at']}" if doc.get("collected_at") else ""
    sides = [f"{side} {', '.join(names)}" for side in SIDES if (names := _worker_list(doc, side))]
    stale = f"; stale files of other runs: {len(workers['stale'])}" if workers.get("stale") else ""
    lines = [
        f"nemo-rl-attn-align report: verdict {doc['verdict'].upper()} (on_mismatch: "
        f"{OnMismatch.of(doc['settings']['on_mismatch']).text()}{point})",
        "workers: "
        + "; ".join(sides or ["none recorded"])
        + f"; missing: {', '.join(workers['missing']) or 'none'}; unreadable: {len(workers['unreadable'])}"
        + f"; incomplete writes: {len(workers['incomplete_writes'])}{stale}",
    ]
    coverage = coverage_line(workers.get("coverage") or {})
    if coverage:
        lines.append(coverage)
    lines.extend(f["message"] for f in doc["findings"] if f["code"] == Code.REPORT_SIDE_ABSENT.value)
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
    share = attention_share_line(doc["drift"])
    if share:
        lines.append(share)
    lines.extend(render_findings(doc["findings"]))
    return "\n".join(lines)


def attention_share_line(drift: Mapping[str, Any]) -> str | None:
    """ "observed X; attention alone about Y ..." from the last step and the attention-only estimate."""
    estimate = drift.get("attention_only")
    if not estimate:
        return None
    engines = f"{estimate.get('training_engine')} vs {estimate.get('rollout_engine')}"
    if estimate["status"] == "unavailable":
        return f"attention's share: not estimated ({estimate['why']})"
    if estimate["status"] == "zero_by_construction":
        return f"attention's share: 0 by construction ({estimate['why']})"
    figure = estimate["figures"]["token_mult_prob_error"]
    alone = f"attention alone about {figure['value']:.6g} ({figure['low']:.6g} to {figure['high']:.6g})"
    observed = [s["token_mult_prob_error"] for s in drift["steps"] if "token_mult_prob_error" in s]
    seen = f"observed token_mult_prob_error {observed[-1]:.6g} at the last step; " if observed else ""
    return f"attention's share: {seen}{alone} on random inputs at these shapes ({engines}; an estimate from replays)"


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


def render_preview(preview: Any, said: str | None = None) -> str:
    """A ``binding.binding_preview.BindingPreview`` as text: the binding table, its errors and the notes (but
    those holding ``said``, which the caller has printed already)."""
    lines = ["attention contract preview (from the config; 'pending' = known only once the engines run):"]
    if preview.binding is not None:
        binding = preview.binding.to_dict()
        lines.append(render_binding(binding))
        lines.extend(render_findings(binding["findings"], shown=("error",)))
    lines.extend(f"note: {note}" for note in preview.notes if said is None or said not in note)
    return "\n".join(lines)
