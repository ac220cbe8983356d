"""``nemo-rl-attn-align check [CONFIG] [OVERRIDES...]``: can these attention settings work?

Reads the config exactly as NeMo-RL's recipes do, builds the backend plan, runs every rule,
validates the ``attention_align:`` block and previews the training/rollout attention binding.
Exit 0: it can work (warnings allowed); 1: a rule is violated, or the preview fails a binding
tier whose ``attention_align.on_mismatch`` is ``error`` (the run would stop at start); 2: the input is
unusable. Imports neither torch nor megatron-core.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.cli import check_behaviour
from nemo_rl_attn_align.cli.check_text import PENDING_IDENTITY, model_said, render_text, short_preview
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE

if TYPE_CHECKING:
    from nemo_rl_attn_align.aligning.preset import Alignment
    from nemo_rl_attn_align.binding.binding_preview import BindingPreview
    from nemo_rl_attn_align.config.settings import AlignSettings
    from nemo_rl_attn_align.kernels.kernel_query import KernelOptions, KernelPlan
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts


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
    parser.add_argument(
        "--fix",
        action="store_true",
        help="print the smallest list of Hydra overrides that makes the binding preview pass",
    )
    parser.add_argument(
        "--gpu",
        metavar="GPU",
        help="predict the kernel each side runs on this GPU: a generation (sm80, sm86, sm89, sm90, sm100, sm103, "
        "sm110, sm120) or a product (A100, A10, L40S, H100, H200, B200, GB200, B300, RTX PRO 6000, ...); default: "
        "this machine's GPU; without one the kernels are pending",
    )
    parser.add_argument(
        "--fa3", action="store_true", help="assume flash-attn 3 (the hopper build) is installed beside flash-attn 2"
    )
    parser.add_argument(
        "--te",
        metavar="VERSION",
        help="the Transformer Engine version to predict for (default: the installed one, else NeMo-RL main's pin)",
    )
    parser.add_argument(
        "--vllm",
        metavar="VERSION",
        help="the vLLM version to predict for (default: the installed one, else NeMo-RL main's pin, else the newest)",
    )
    check_behaviour.add_arguments(parser)
    parser.add_argument(
        "args",
        nargs="*",
        metavar="CONFIG [OVERRIDES...]",
        help="the YAML file, then Hydra-style overrides: a.b=v, ++a.b=v (new key), ~a.b (delete)",
    )
    parser.set_defaults(handler=run, overrides_dest="args")


def _looks_like_override(token: str) -> bool:
    return token.startswith(("+", "~")) or ("=" in token and not token.endswith((".yaml", ".yml")))


def split_config_and_overrides(tokens: list[str]) -> tuple[Path, list[str]]:
    """The CONFIG path (the packaged example when the first token is already an override) and the overrides."""
    from nemo_rl_attn_align.config.example_recipes import default_example_path

    if not tokens or (_looks_like_override(tokens[0]) and not os.path.lexists(tokens[0])):
        return default_example_path(), list(tokens)
    return Path(tokens[0]), list(tokens[1:])


def evaluate(
    config_path: Path,
    overrides: list[str],
    environ: Mapping[str, str] | None = None,
    full: bool = False,
    fix: bool = False,
    kernel_options: KernelOptions | None = None,
    behaviour: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Load, plan, check and preview the binding (after ``attention_align.preset`` when set); with
    ``fix``, also the overrides that make the preview pass; the kernels asked as ``kernel_options``
    say (on its ``gpu``, default this machine's); with ``behaviour`` (side -> interpreter, None: this
    one), each side's rope, mask and softmax computed by its host (``check_behaviour``). The
    JSON-ready dict ``--json`` prints."""
    from nemo_rl_attn_align.aligning.preset import align
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.preflight.plan import build_plan
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    environ = os.environ if environ is None else environ
    cfg = load_config(config_path, overrides)
    facts = read_recipe_facts(cfg, environ)
    facts.require_usable_model()
    plan = build_plan(facts)
    settings = load_settings(cfg)
    chosen, source, options = _gpu(kernel_options)

    read = functools.partial(read_recipe_facts, environ=environ, files=facts.files)  # the rounds: the same files
    preview_of = functools.partial(preview_binding, settings=settings, environ=environ)
    step = _kernel_step(chosen, environ, options)
    alignment = align(cfg, read, preview_of, kernels=step) if settings.preset == "aligned" else None
    final = alignment.facts if alignment is not None else facts
    kernel_plan, kernels = _kernels(final, chosen, source, environ, options)
    kernels["findings"] += _kernel_step_findings(alignment)
    predicted = _rollout_backends(kernel_plan)  # the preset and --fix search with vLLM's choice assumed
    aligned = alignment.config if alignment is not None else cfg
    if behaviour is not None:
        final = check_behaviour.compute(final, behaviour)
    if predicted is not None or behaviour is not None:
        preview = preview_binding(final, settings, environ, predicted)
    else:
        preview = alignment.preview if alignment is not None else preview_of(facts)
    preview_dict = preview.to_dict()
    failed = preview_dict["binding"]["failed_tiers"] if preview_dict["binding"] else []
    stops_at_start = preview_dict["verdict"] == "fail" and settings.on_mismatch.applied(failed) == "error"
    kernel_errors = any(f["severity"] == "error" for f in kernels["findings"])
    ok = plan.ok and not stops_at_start and not kernel_errors
    return {
        "config": str(config_path),
        "overrides": overrides,
        "plan": plan.to_dict(),
        "kernels": kernels,
        "attention_align": {
            "settings": settings.to_dict(),
            **preview_dict,
            "preset": alignment.to_dict() if alignment is not None else None,
        },
        "behaviour": {c.side: c.to_dict() for c in final.behaviour} if behaviour is not None else None,
        "fix": _fix(aligned, read, preview_of, step and functools.partial(step, alter_ok=True)) if fix else None,
        "preview_text": _preview_text(preview, preview_dict, settings, kernels["model"], full),
        "verdict": "ok" if ok else "violation",
        "exit_code": EXIT_OK if ok else EXIT_FAILED,
    }


def _preview_text(
    preview: BindingPreview, preview_dict: dict[str, Any], settings: AlignSettings, model: dict[str, Any], full: bool
) -> str:
    """The binding preview as ``check`` prints it (``--full``: every field), without what the model
    line says; an unknown model's pending identity fields are one phrase."""
    from nemo_rl_attn_align.report.report_render import render_preview

    said = model_said(model)
    if full:
        return render_preview(preview, said)
    pending = PENDING_IDENTITY if model["config"] is None else None
    summary = preview.binding.summary_line(pending) if preview.binding is not None else None
    return short_preview(preview_dict, settings.on_mismatch, summary, said)


def _gpu(options: KernelOptions | None) -> tuple[str | None, str, KernelOptions]:
    """The GPU the kernels are predicted for (``options.gpu``, ``--gpu``, else this machine's), how it
    was chosen, and ``options`` with ``live`` set when it is this machine's."""
    from nemo_rl_attn_align.kernels import gpu as gpus
    from nemo_rl_attn_align.kernels.kernel_query import KernelOptions

    options = options or KernelOptions()
    local, local_source = gpus.local_gpu()
    chosen, source = (gpus.parse_gpu(options.gpu), "--gpu") if options.gpu is not None else (local, local_source)
    return chosen, source, replace(options, live=chosen is not None and chosen == local)


def _kernels(
    facts: RecipeFacts, gpu: str | None, source: str, environ: Mapping[str, str], options: KernelOptions
) -> tuple[KernelPlan, dict[str, Any]]:
    """The kernel each side runs on ``gpu`` and its JSON form, with the model and the kernel findings.
    With no GPU known nothing is predicted, and the kernel machinery is not even imported."""
    from nemo_rl_attn_align.kernels.kernel_query import KernelPlan

    if gpu is None:
        plan, findings = KernelPlan.pending(source), []
    else:
        from nemo_rl_attn_align.kernels.kernel_prediction import kernel_findings, plan_kernels

        plan = plan_kernels(facts, gpu, source, environ, options)
        findings = [f.to_dict() for f in kernel_findings(plan, options)]
    return plan, {**plan.to_dict(), "model": facts.model.to_dict(), "findings": findings}


def _kernel_step(gpu: str | None, environ: Mapping[str, str], options: KernelOptions):
    """``kernel_choice.kernel_step`` on ``gpu``; None with no GPU known (it chooses nothing: not imported)."""
    if gpu is None:
        return None
    from nemo_rl_attn_align.kernels.kernel_choice import kernel_step

    return functools.partial(kernel_step, gpu=gpu, environ=environ, options=options)


def _kernel_step_findings(alignment: Alignment | None) -> list[dict[str, Any]]:
    """The preset's kernel-step warning (``KERNEL_PAIR_SPLIT``), beside the kernel findings."""
    split = alignment.kernels.finding if alignment is not None and alignment.kernels is not None else None
    return [split.to_dict()] if split is not None else []


def _rollout_backends(plan: KernelPlan) -> tuple[str, ...] | None:
    """The vLLM backends the plan predicts for the rollout's layer kinds (None: not all are known)."""
    kernels = [kind.kernel for kind in plan.rollout]
    if not kernels or not all(k.known and k.kernel for k in kernels) or plan.rollout[0].query is None:
        return None  # no prediction, a kind without a backend, or Megatron generation (no vLLM query)
    return tuple(str(k.kernel) for k in kernels)


def _fix(cfg: Mapping[str, Any], read, preview_of, kernels) -> dict[str, Any]:
    """The smallest set of overrides after which the preview's semantic and determinism tiers pass,
    and the kernel step's (one flash-attn generation on both sides, on the GPU known)."""
    from nemo_rl_attn_align.aligning.fix import minimal
    from nemo_rl_attn_align.aligning.preset import align

    alignment = align(cfg, read, preview_of, alter_ok=True, kernels=kernels)
    if alignment.preview.binding is None:
        return {
            "overrides": [],
            "changes": [],
            "none_because": "the config has no training and rollout side to bind",
            "kernels": None,
            "recommended": [],
        }
    recommended = [c.to_dict() for c in alignment.recommended]
    if alignment.refusal is not None:
        return {
            "overrides": [],
            "changes": [],
            "none_because": alignment.refusal.line(),
            "kernels": None,
            "recommended": recommended,
        }
    changes = minimal(cfg, alignment, read, preview_of)
    return {
        "overrides": [c.override() for c in changes],
        "changes": [c.to_dict() for c in changes],
        "none_because": None,
        "kernels": alignment.kernels.to_dict() if alignment.kernels else None,
        "recommended": recommended,
    }


def _require_table_versions(options: KernelOptions) -> None:
    """``--te`` / ``--vllm`` name a version the kernel tables know, else the ``UsageError`` listing those
    they know (the kernel machinery is imported only when one is given)."""
    if options.te is None and options.vllm is None:
        return
    from nemo_rl_attn_align.kernels.kernel_prediction import unknown_version
    from nemo_rl_attn_align.vocab.errors import UsageError

    for side, requested in (("training", options.te), ("rollout", options.vllm)):
        unknown = unknown_version(side, requested) if requested is not None else None
        if unknown is not None:
            raise UsageError(
                f"{unknown}. Fix: pass one of them, or leave the flag out (the installed version, "
                "else NeMo-RL main's pin)."
            )


def run(args: argparse.Namespace) -> int:
    """Handler of ``check``; returns the exit code. Python's cyclic garbage collector is paused
    meanwhile: ``check`` makes no garbage cycles worth collecting, and the collector's passes over
    the objects its imports and OmegaConf create cost about 6 ms of its ~80 (benchmarks/check_walltime.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if enabled:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    from nemo_rl_attn_align.kernels.kernel_query import KernelOptions
    from nemo_rl_attn_align.model.model_facts import hosts_read_here
    from nemo_rl_attn_align.vocab.errors import UsageError, strict_json
    from nemo_rl_attn_align.vocab.limits import shown_text

    options = KernelOptions(flash_attn_3=args.fa3, te=args.te, vllm=args.vllm, gpu=args.gpu)
    try:
        _require_table_versions(options)
        behaviour = check_behaviour.requested(args)
        config_path, overrides = split_config_and_overrides(args.args)
        with hosts_read_here():  # an architecture the table lacks: read by the host where it is installed
            result = evaluate(
                config_path, overrides, full=args.full, fix=args.fix, kernel_options=options, behaviour=behaviour
            )
    except UsageError as err:
        message = shown_text(str(err), 2000)
        if args.json:
            print(jsonio.dumps({"error": message, "exit_code": EXIT_UNUSABLE}))
        print(f"error: {message}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.json:
        print(jsonio.dumps(strict_json({k: v for k, v in result.items() if k != "preview_text"}), indent=2))
    else:
        print(render_text(result))
    return result["exit_code"]
