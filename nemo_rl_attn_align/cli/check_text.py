"""The text ``check`` prints: the verdict, the plan's findings, the preset's changes, the kernels,
``--fix``'s overrides and the binding preview in a few lines (``render_text``; ``--json`` prints the
dict ``evaluate`` returns instead)."""

from __future__ import annotations

from typing import Any

from nemo_rl_attn_align.config.settings import OnMismatch

CONSEQUENCE = {
    "error": "the run stops at start",
    "warn": "the run warns and goes on",
    "record": "the run only records it in the report",
}


def finding_tier(finding: dict[str, Any]) -> str:
    """The binding tier a failing finding belongs to (``contract.<tier>.<field>``; a determinism
    difference is semantic)."""
    parts = finding["key"].split(".")
    return parts[1] if parts[0] == "contract" and len(parts) > 2 else "semantic"


def short_preview(preview: dict[str, Any], on_mismatch: OnMismatch) -> str:
    """The binding preview in a few lines: the verdict's summary, what fails it, the notes. A
    failing field is labelled ``error`` only where the run would stop (its tier's ``on_mismatch``
    is ``error``)."""
    from nemo_rl_attn_align.vocab.errors import format_finding

    binding = preview["binding"]
    if binding is None:
        lines = ["binding preview: not applicable (the config has no training and rollout side to bind)"]
    else:
        lines = [f"binding preview ('pending' = known once the engines run): {binding['summary']}"]
        failing = [f for f in binding["findings"] if f["severity"] == "error"]
        for f in failing:
            label = "error" if on_mismatch.applied([finding_tier(f)]) == "error" else "warning"
            lines.append(f"  {format_finding({**f, 'severity': label})}")
        if failing:
            lines.append(
                "  (check --fix lists the overrides that remove these; attention_align.preset: aligned applies them)"
            )
        lines.append("  (--full shows every field)")
    lines += [f"  note: {note}" for note in preview["notes"]]
    return "\n".join(lines)


def _preset_lines(preset: dict[str, Any] | None) -> list[str]:
    if preset is None:
        return []
    lines = [f"preset aligned: {len(preset['changes'])} change(s) applied before any worker starts"]
    lines += [f"  {c['key']}={c['value']!r}: {c['reason']}" for c in preset["changes"]]
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


def _fix_lines(fix: dict[str, Any] | None) -> list[str]:
    if fix is None:
        return []
    also = [f"fix: also recommended: {c['override']} ({c['reason']})" for c in fix["recommended"]]
    if fix["none_because"] is not None:
        return [f"fix: none: {fix['none_because']}", *also]
    if not fix["overrides"]:
        return [
            "fix: none needed: the semantic and determinism tiers already pass",
            *_pair_lines(fix["kernels"]),
            *also,
        ]
    lines = ["fix: add after the recipe on the command line:", "  " + " ".join(fix["overrides"])]
    lines += [f"  ({c['key']}: {c['reason']})" for c in fix["changes"] if c["alters_run"]]
    split = fix["kernels"] and fix["kernels"]["finding"]
    if split:
        from nemo_rl_attn_align.vocab.errors import format_finding

        lines.append(f"  {format_finding(split)}")
    return lines + _pair_lines(fix["kernels"]) + also


def _kernel_line(name: str, kernel: dict[str, Any]) -> list[str]:
    head = f"  {name}, {kernel['layers']}:"
    if kernel["pending"]:
        return [f"{head} pending ({kernel['pending']})"]
    belief = "; FusedAttention's cuDNN check is our stand-in, not TE" if kernel["belief"] else ""
    lines = [head, f"    {kernel['label']} ({kernel['source']}{belief})"]
    why = [r for r in kernel["reasons"] if " due to NVTE_" not in r][:3]  # the switches' lines restate the backend
    lines += [f"    why: {reason.strip()}" for reason in why]
    if kernel["assumptions"]:
        lines.append(f"    assumes: {'; '.join(kernel['assumptions'])}")
    return lines


def _model_lines(model: dict[str, Any]) -> list[str]:
    """Where the model's attention was read, per side, and its per-layer layout there."""
    if model["config"] is None:
        return [f"  model: {model['not_found']}"]
    lines = [f"  model: {model['config']} ({model['architecture'] or 'no architectures[0]'})"]
    for side in ("training", "rollout"):
        read = model[side]
        lines.append(f"    {side}: {read['source'] if 'source' in read else 'not read: ' + read['not_read']}")
        lines += [f"      {kind}" for kind in read.get("layout", [])]
    return lines


def _kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """The model, then the kernel each layer kind runs on each side, with the selectors' reasons, then errors."""
    from nemo_rl_attn_align.vocab.errors import format_finding

    if kernels["gpu"] is None:
        return [f"kernels: pending ({kernels['gpu_source']})", *_model_lines(kernels["model"])]
    lines = [f"kernels on {kernels['gpu']} ({kernels['gpu_source']}):", *_model_lines(kernels["model"])]
    for side in ("training", "rollout"):
        for kernel in kernels[side]:
            lines += _kernel_line(side, kernel)
    lines += [f"  note: {note}" for note in kernels["notes"]]
    lines += [format_finding(f) for f in kernels["findings"]]
    return lines


def render_text(result: dict[str, Any]) -> str:
    """The human-readable form of ``evaluate``'s result."""
    from nemo_rl_attn_align.vocab.errors import format_finding
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
    lines.extend(format_finding(f) for f in plan["findings"])
    lines.extend(_kernel_lines(result["kernels"]))
    lines.extend(_preset_lines(result["attention_align"]["preset"]))
    lines.append(result["preview_text"])
    align = result["attention_align"]
    if align["verdict"] == "fail":
        on_mismatch = OnMismatch.of(align["settings"]["on_mismatch"])
        failed = align["binding"]["failed_tiers"]
        mode = on_mismatch.applied(failed)
        lines.append(
            f"binding preview: fail ({', '.join(failed)}); attention_align.on_mismatch: {on_mismatch.text()}: "
            f"{CONSEQUENCE[mode]}"
        )
    lines.extend(_fix_lines(result["fix"]))
    if result["verdict"] == "ok":
        lines.append("verdict: OK: these attention settings can work")
    elif not plan["ok"]:
        lines.append("verdict: FAIL: a rule is violated")
    elif any(f["severity"] == "error" for f in result["kernels"]["findings"]):
        lines.append(f"verdict: FAIL: a side has no attention kernel on {result['kernels']['gpu']}")
    else:
        lines.append("verdict: FAIL: the binding preview fails a tier whose attention_align.on_mismatch is error")
    return "\n".join(lines)
