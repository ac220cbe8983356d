"""``nemo-rl-attn-align check [CONFIG] [OVERRIDES...]``: can these attention settings work?

Reads the config exactly as NeMo-RL's recipes do, builds the backend plan, runs every rule,
validates the ``attention_align:`` block and previews the training/rollout attention binding.
Exit 0: it can work (warnings allowed); 1: a rule is violated, or the preview fails the binding
while ``attention_align.on_mismatch`` is ``error`` (the run would stop at start); 2: the input is
unusable. Imports neither torch nor megatron-core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_VIOLATION, EXIT_UNUSABLE = 0, 1, 2


def register(subparsers) -> None:
    """Add the ``check`` parser."""
    parser = subparsers.add_parser(
        "check",
        help="check a NeMo-RL YAML's attention settings before any GPU work",
        description="Resolve a NeMo-RL config (defaults:, ${...}, Hydra overrides) and check its attention "
        "settings. With no CONFIG, checks the packaged example grpo_math_1B_megatron_flash.yaml. "
        "Exit 0: can work; 1: a rule is violated; 2: unusable input.",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--full", action="store_true", help="show every field of the binding preview")
    parser.add_argument("args", nargs="*", metavar="CONFIG [OVERRIDES...]",
                        help="the YAML file, then Hydra-style overrides: a.b=v, ++a.b=v (new key), ~a.b (delete)")
    parser.set_defaults(handler=run)


def _looks_like_override(token: str) -> bool:
    return token.startswith(("+", "~")) or ("=" in token and not token.endswith((".yaml", ".yml")))


def split_config_and_overrides(tokens: list[str]) -> tuple[Path, list[str]]:
    """The CONFIG path (the packaged example when the first token is already an override) and the overrides."""
    from nemo_rl_attn_align.config import default_example_path

    if not tokens or (_looks_like_override(tokens[0]) and not os.path.exists(tokens[0])):
        return default_example_path(), list(tokens)
    return Path(tokens[0]), list(tokens[1:])


def evaluate(config_path: Path, overrides: list[str], environ=None, full: bool = False) -> dict[str, Any]:
    """Load, plan, check and preview the binding; the JSON-ready dict that ``--json`` prints."""
    from nemo_rl_attn_align.config import load_config
    from nemo_rl_attn_align.plan import build_plan
    from nemo_rl_attn_align.preview import preview_binding
    from nemo_rl_attn_align.settings import load_settings

    cfg = load_config(config_path, overrides)
    plan = build_plan(cfg, environ)
    settings = load_settings(cfg)
    preview = preview_binding(cfg, settings, environ)
    preview_dict = preview.to_dict()
    stops_at_start = settings.on_mismatch == "error" and preview_dict["verdict"] == "fail"
    ok = plan.ok and not stops_at_start
    return {
        "config": str(config_path),
        "overrides": overrides,
        "plan": plan.to_dict(),
        "attention_align": {"settings": settings.model_dump(mode="json"), **preview_dict},
        "preview_text": preview.render() if full else _short_preview(preview_dict),
        "verdict": "ok" if ok else "violation",
        "exit_code": EXIT_OK if ok else EXIT_VIOLATION,
    }


def _short_preview(preview: dict[str, Any]) -> str:
    """The binding preview in a few lines: the verdict's summary, its errors, the notes."""
    from nemo_rl_attn_align.report import render_findings

    binding = preview["binding"]
    if binding is None:
        lines = ["binding preview: not applicable (the config has no training and rollout side to bind)"]
    else:
        lines = [f"binding preview ('pending' = known once the engines run): {binding['summary']}"]
        lines += [f"  {line}" for line in render_findings(binding["findings"], shown=("error",))]
        lines.append("  (--full shows every field)")
    lines += [f"  note: {note}" for note in preview["notes"]]
    return "\n".join(lines)


def render_text(result: dict[str, Any]) -> str:
    """The human-readable form of ``evaluate``'s result."""
    from nemo_rl_attn_align.errors import format_finding

    plan = result["plan"]
    lines = [f"config: {result['config']}"]
    if result["overrides"]:
        lines.append(f"overrides: {' '.join(result['overrides'])}")
    if not plan["megatron_enabled"]:
        lines.append("megatron: disabled (policy.megatron_cfg.enabled is not truthy); attention_backend is not used")
    else:
        requested = "unset" if plan["requested"] is None else repr(plan["requested"])
        lines.append(f"attention_backend: {requested} -> {plan['attn_backend'] or 'invalid'} ({plan['source']})")
        lines.append(f"precision: {plan['precision'] or 'invalid'}")
        if plan["nvte"]:
            lines.append("NVTE set by Megatron at model build: " + " ".join(f"{k}={v}" for k, v in plan["nvte"].items()))
        existing = plan["nvte_existing"]
        lines.append("NVTE already set: " + (", ".join(f"{k}={v['value']} ({v['source']})" for k, v in existing.items()) or "none"))
    lines.extend(format_finding(f) for f in plan["findings"])
    lines.append(result["preview_text"])
    align = result["attention_align"]
    on_mismatch = align["settings"]["on_mismatch"]
    if align["verdict"] == "fail":
        consequence = {"error": "the run would stop at start", "warn": "the run would warn and go on",
                       "record": "the run would only record it"}[on_mismatch]
        lines.append(f"binding preview: fail; attention_align.on_mismatch={on_mismatch}: {consequence}")
    if result["exit_code"] == EXIT_OK:
        lines.append("verdict: OK: these attention settings can work")
    elif not plan["ok"]:
        lines.append("verdict: FAIL: a rule is violated")
    else:
        lines.append("verdict: FAIL: the binding preview fails and attention_align.on_mismatch is error")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handler of ``check``; returns the exit code."""
    from nemo_rl_attn_align.errors import UsageError

    try:
        config_path, overrides = split_config_and_overrides(args.args)
        result = evaluate(config_path, overrides, full=args.full)
    except UsageError as err:
        if args.json:
            print(json.dumps({"error": str(err), "exit_code": EXIT_UNUSABLE}))
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "preview_text"}, indent=2))
    else:
        print(render_text(result))
    return result["exit_code"]
