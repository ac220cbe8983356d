"""The text ``check`` prints: the plan's findings, the model, the kernels, the preset's changes,
the binding preview in a few lines, ``--fix``'s overrides and one closing line (``render_text``;
``--json`` prints the dict ``evaluate`` returns instead).

Each thing is said once: the model line says where the model's config.json was read or looked for,
and every later line that would repeat it (a kernel pending on it, the preview's identity fields and
note) points back to it (``MODEL_ABOVE``); changes that share a reason are listed under it once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from nemo_rl_attn_align.config.settings import OnMismatch

CONSEQUENCE = {
    "error": "the run stops at start",
    "warn": "the run warns and goes on",
    "record": "the run only records it in the report",
}
#: How a later line names what the model line already said.
MODEL_ABOVE = "see 'model:' above"
#: The preview's pending identity fields in one phrase, where the model is not known.
PENDING_IDENTITY = f"identity pending until the model is known ({MODEL_ABOVE})"


def model_said(model: dict[str, Any]) -> str:
    """What the model line says that other lines would repeat: the config.json read, or where it was
    looked for."""
    return model["config"] if model["config"] is not None else model["not_found"]


def _pointing_up(text: str, said: str) -> str:
    """``text`` with ``said`` (in parentheses or not) replaced by a pointer to the model line."""
    return text.replace(f" ({said})", f": {MODEL_ABOVE}").replace(said, MODEL_ABOVE)


def finding_tier(finding: dict[str, Any]) -> str:
    """The binding tier a failing finding belongs to (``contract.<tier>.<field>``; a determinism
    difference is semantic)."""
    parts = finding["key"].split(".")
    return parts[1] if parts[0] == "contract" and len(parts) > 2 else "semantic"


def short_preview(preview: dict[str, Any], on_mismatch: OnMismatch, summary: str | None, said: str) -> str:
    """The binding preview in a few lines: ``summary`` (the binding's summary line), what fails it,
    the notes the model line (``said``) does not already say. A failing field is labelled ``error``
    only where the run would stop (its tier's ``on_mismatch`` is ``error``)."""
    from nemo_rl_attn_align.vocab.errors import format_finding

    binding = preview["binding"]
    if binding is None:
        lines = ["binding preview: not applicable (the config has no training and rollout side to bind)"]
    else:
        lines = [f"binding preview ('pending' = known once the engines run): {summary}"]
        failing = [f for f in binding["findings"] if f["severity"] == "error"]
        for f in failing:
            label = "error" if on_mismatch.applied([finding_tier(f)]) == "error" else "warning"
            lines.append(f"  {format_finding({**f, 'severity': label})}")
        if failing:
            lines.append(
                "  (check --fix lists the overrides that remove these; attention_align.preset: aligned applies them)"
            )
        lines.append("  (--full shows every field)")
    lines += [f"  note: {note}" for note in preview["notes"] if said not in note]
    return "\n".join(lines)


def _by_reason(changes: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[tuple[str, str]]:
    """(labels, reason) of ``changes`` with each reason once: a change whose reason extends an earlier
    one joins it, its label carrying the rest."""
    groups: dict[str, list[str]] = {}
    for change in changes:
        reason = change["reason"]
        shared = next((r for r in groups if reason.startswith(r)), None)
        if shared is None:
            groups[reason] = [label(change)]
        else:
            groups[shared].append(f"{label(change)}{reason[len(shared) :]}")
    return [(", ".join(labels), reason) for reason, labels in groups.items()]


def _setting(change: dict[str, Any]) -> str:
    return f"{change['key']}={change['value']!r}"


def _preset_lines(preset: dict[str, Any] | None) -> list[str]:
    if preset is None:
        return []
    lines = [f"preset aligned: {len(preset['changes'])} change(s) applied before any worker starts"]
    lines += [f"  {labels}: {reason}" for labels, reason in _by_reason(preset["changes"], _setting)]
    if preset["refusal"] is not None:
        from nemo_rl_attn_align.vocab.errors import format_finding

        lines.append(f"  cannot align: {format_finding(preset['refusal'])}")
    lines += [f"  not applied, recommended: {c['key']}={c['value']!r}: {c['reason']}" for c in preset["recommended"]]
    return lines + _pair_lines(preset["kernels"])


def _pair_lines(kernels: dict[str, Any] | None) -> list[str]:
    """The kernel step's pair in one line (its warning is with the kernel findings)."""
    if kernels is None:
        return []
    how = "one flash-attn generation" if kernels["one_generation"] else "two flash-attn generations (KERNEL_PAIR_SPLIT)"
    return [f"  kernels: training {kernels['training']}, rollout {kernels['rollout']}: {how}"]


def _fix_lines(fix: dict[str, Any] | None, recommended_above: Collection[str]) -> list[str]:
    """``--fix``'s overrides, each reason once; a recommendation the preset's lines already gave
    (``recommended_above``: their keys) points back to them."""
    if fix is None:
        return []
    also = [
        f"fix: also recommended: {c['override']} "
        + ("(the preset's recommendation above)" if c["key"] in recommended_above else f"({c['reason']})")
        for c in fix["recommended"]
    ]
    if fix["none_because"] is not None:
        return [f"fix: none: {fix['none_because']}", *also]
    if not fix["overrides"]:
        return [
            "fix: none needed: the semantic and determinism tiers already pass",
            *_pair_lines(fix["kernels"]),
            *also,
        ]
    lines = ["fix: add after the recipe on the command line:", "  " + " ".join(fix["overrides"])]
    altering = [c for c in fix["changes"] if c["alters_run"]]
    lines += [f"  ({keys}: {reason})" for keys, reason in _by_reason(altering, lambda c: c["key"])]
    split = fix["kernels"] and fix["kernels"]["finding"]
    if split:
        from nemo_rl_attn_align.vocab.errors import format_finding

        lines.append(f"  {format_finding(split)}")
    return lines + _pair_lines(fix["kernels"]) + also


def _kernel_detail(kernel: dict[str, Any], said: str) -> list[str]:
    """One side's kernel for a layer kind, the selector's reasons and what it assumes (or why it is
    pending), as lines for the caller to indent."""
    if kernel["pending"]:
        return [f"pending ({_pointing_up(kernel['pending'], said)})"]
    belief = "; FusedAttention's cuDNN check is our stand-in, not TE" if kernel["belief"] else ""
    lines = [f"{kernel['label']} ({kernel['source']}{belief})"]
    why = [r for r in kernel["reasons"] if " due to NVTE_" not in r][:3]  # the switches' lines restate the backend
    lines += [f"why: {reason.strip()}" for reason in why]
    if kernel["assumptions"]:
        lines.append(f"assumes: {'; '.join(kernel['assumptions'])}")
    return lines


def _side_by_side(training: list[dict[str, Any]], rollout: list[dict[str, Any]], said: str) -> list[str]:
    """Both sides' kernels under each layer kind they share (one line where both are pending alike)."""
    lines = []
    for t, r in zip(training, rollout, strict=True):
        if t["pending"] and t["pending"] == r["pending"]:
            lines.append(f"  {t['layers']}: pending on both sides ({_pointing_up(t['pending'], said)})")
            continue
        lines.append(f"  {t['layers']}:")
        for side, kernel in (("training", t), ("rollout", r)):
            first, *rest = _kernel_detail(kernel, said)
            lines += [f"    {side}: {first}", *(f"      {line}" for line in rest)]
    return lines


def _model_lines(model: dict[str, Any]) -> list[str]:
    """Where the model's attention was read (locally only), per side, and its per-layer layout there;
    or the one line why it is not known."""
    if model["config"] is None:
        return [f"  model: {model['not_found']}"]
    lines = [f"  model: {model['config']} ({model['architecture'] or 'no architectures[0]'}; local, never fetched)"]
    for side in ("training", "rollout"):
        read = model[side]
        if "source" in read:  # the architecture is named on the model line
            said = f"{read['host']}'s reading of {model['architecture']}, "
            lines.append(f"    {side}: {read['source'].replace(said, read['host'] + ', ', 1)}")
        else:
            lines.append(f"    {side}: not read: {read['not_read']}")
        lines += [f"      {kind}" for kind in read.get("layout", [])]
    return lines


def _kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """The model, then the kernel each layer kind runs on each side (under the kind where both sides
    have the same kinds), with the selectors' reasons, then errors."""
    if kernels["gpu"] is None:
        return [f"kernels: pending ({kernels['gpu_source']})", *_model_lines(kernels["model"])]
    said = model_said(kernels["model"])
    lines = [f"kernels on {kernels['gpu']} ({kernels['gpu_source']}):", *_model_lines(kernels["model"])]
    training, rollout = kernels["training"], kernels["rollout"]
    if rollout and [k["layers"] for k in training] == [k["layers"] for k in rollout]:
        lines += _side_by_side(training, rollout, said)
    else:
        for side, kinds in (("training", training), ("rollout", rollout)):
            for kernel in kinds:
                first, *rest = _kernel_detail(kernel, said)
                head = f"  {side}, {kernel['layers']}:"
                lines += [f"{head} {first}"] if kernel["pending"] else [head, *(f"    {x}" for x in (first, *rest))]
    lines += [f"  note: {note}" for note in kernels["notes"]]
    return lines + _finding_lines(kernels["findings"])


def _finding_lines(findings: list[dict[str, Any]]) -> list[str]:
    """One line per finding; a fix an earlier one gave is said as such."""
    from nemo_rl_attn_align.vocab.errors import format_finding

    lines, fixes = [], set()
    for f in findings:
        lines.append(format_finding({**f, "fix": "as above"} if f["fix"] in fixes else f))
        fixes.add(f["fix"])
    return lines


def _preview_found(align: dict[str, Any]) -> str:
    """What the binding preview found, in a few words, with what the run does about it."""
    binding = align["binding"]
    if binding is None:
        return "no binding to preview"
    failing = [f for f in binding["findings"] if f["severity"] == "error"]
    if not failing:
        known = "" if align["verdict"] == "pass" else " among the fields known before the run"
        return f"the preview finds no mismatch{known}"
    on_mismatch = OnMismatch.of(align["settings"]["on_mismatch"])
    tiers = Counter(finding_tier(f) for f in failing)
    parts = []
    for tier, count in tiers.items():
        names = ", ".join(f["key"].rsplit(".", 1)[-1] for f in failing if finding_tier(f) == tier)
        mode = on_mismatch.applied([tier])
        plural = "es" if count > 1 else ""
        parts.append(f"{count} {tier} mismatch{plural} ({names}): {CONSEQUENCE[mode]} (on_mismatch {tier}: {mode})")
    return "the preview finds " + "; ".join(parts)


def closing_line(result: dict[str, Any]) -> str:
    """The last line: whether the run can start, and what the preview found."""
    found = _preview_found(result["attention_align"])
    if result["verdict"] == "ok":
        return f"verdict: OK to launch; {found}"
    why = []
    if not result["plan"]["ok"]:
        why.append("a rule is violated (above)")
    if any(f["severity"] == "error" for f in result["kernels"]["findings"]):
        why.append(f"a side has no attention kernel on {result['kernels']['gpu']}")
    return f"verdict: FAIL, not ready to launch: {'; '.join([*why, found])}"


def render_text(result: dict[str, Any]) -> str:
    """The human-readable form of ``evaluate``'s result."""
    from nemo_rl_attn_align.vocab.limits import shown, shown_text

    plan = result["plan"]
    lines = [f"config: {shown_text(result['config'])}"]
    if result["overrides"]:
        lines.append(f"overrides: {' '.join(shown_text(o) for o in result['overrides'])}")
    if not plan["megatron_enabled"]:
        lines.append("megatron: disabled (policy.megatron_cfg.enabled is not truthy); attention_backend is not used")
    else:
        requested = "unset" if plan["requested"] is None else shown(plan["requested"])
        lines.append(f"attention_backend: {requested} -> {plan['attn_backend'] or 'invalid'} ({plan['source']})")
        lines.append(f"precision: {plan['precision'] or 'invalid'}")
        if plan["nvte"]:
            lines.append(
                "NVTE set by Megatron at model build: " + " ".join(f"{k}={v}" for k, v in plan["nvte"].items())
            )
        existing = plan["nvte_existing"]
        lines.append(
            "NVTE already set: "
            + (", ".join(f"{k}={shown_text(v['value'])} ({v['source']})" for k, v in existing.items()) or "none")
        )
    lines.extend(_finding_lines(plan["findings"]))
    lines.extend(_kernel_lines(result["kernels"]))
    preset = result["attention_align"]["preset"]
    lines.extend(_preset_lines(preset))
    lines.append(result["preview_text"])
    recommended_above = [c["key"] for c in preset["recommended"]] if preset is not None else []
    lines.extend(_fix_lines(result["fix"], recommended_above))
    lines.append(closing_line(result))
    return "\n".join(lines)
