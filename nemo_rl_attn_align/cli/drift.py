"""``nemo-rl-attn-align drift [CONFIG] [OVERRIDES...] [options]``: measure train/rollout attention drift.

Runs the reference and each engine's replay (see ``nemo_rl_attn_align.reference.materializers``)
on the attention shape of the config's model, prints a table (or ``--json``), and writes
``drift-report.json`` and ``drift-heatmap.png`` into ``--out`` (default: the config's
``attention_align.report_dir``, i.e. ``<logger.log_dir>/attention_align``; a run's own report is in
its ``exp_NNN`` subdirectory, so pass ``--out`` to put the sweep beside a particular run's report).
Exit 0: done; 2: unusable input (also when torch is not installed). The config and the flags are
checked before torch is imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.drift import shape as drift_shape
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE

if TYPE_CHECKING:
    from nemo_rl_attn_align.drift.sweep import Sweep

REPORT_NAME, HEATMAP_NAME = "drift-report.json", "drift-heatmap.png"


def register(subparsers) -> None:
    """Add the ``drift`` parser."""
    p = subparsers.add_parser(
        "drift",
        help="measure attention drift between training and rollout engines (reference vs replays)",
        description="Run the deterministic reference attention and replays of Transformer Engine, "
        "FlashAttention and vLLM reduction orders on the config's attention shape; report max/mean "
        "|d out|, |d lse| (abs and ulps) and per-token logprob drift for every (training, rollout) pair. "
        "With no CONFIG, uses the packaged example grpo_math_1B_megatron_flash.yaml.",
    )
    p.add_argument(
        "args",
        nargs="*",
        metavar="CONFIG [OVERRIDES...]",
        help="the NeMo-RL YAML, then Hydra-style overrides (a.b=v, ++a.b=v, ~a.b)",
    )
    _add_shape_arguments(p)
    _add_engine_arguments(p)
    _add_run_arguments(p)
    p.set_defaults(handler=run, overrides_dest="args")


def _add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """The attention shape's options, each overriding what the config says."""
    shape = p.add_argument_group("attention shape (each overrides the config)")
    shape.add_argument("--heads", type=int, help="query heads")
    shape.add_argument("--kv-heads", type=int, help="KV heads (query groups)")
    shape.add_argument("--head-dim", type=int, help="head dim")
    shape.add_argument("--window", type=int, help="left sliding window in tokens (FlashAttention convention)")
    shape.add_argument(
        "--seq-len", type=int, help="sequence length (default: policy.max_total_sequence_length, else 1024)"
    )


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """What runs: the dtypes, the GPU generation and the training and rollout engines."""
    p.add_argument(
        "--dtypes",
        default=",".join(drift_shape.DEFAULT_DTYPES),
        help=f"comma list of {', '.join(drift_shape.DTYPE_NAMES)} (default: all)",
    )
    p.add_argument(
        "--gpu",
        default=drift_shape.DEFAULT_GPU,
        help="the GPU the run will use, a generation (sm80 ... sm120) or a product name (A100, L40S, H100, "
        f"B300, ...): selects the engines' paths (default {drift_shape.DEFAULT_GPU}, what NeMo-RL's recipes target)",
    )
    p.add_argument(
        "--training",
        action="append",
        metavar="ENGINE",
        help="a training engine, repeatable, e.g. te-p2p:cp=2 (default: the kernel Transformer Engine's selector "
        "picks for the config on --gpu, as check --gpu predicts, with its context_parallel_size)",
    )
    p.add_argument(
        "--rollout",
        action="append",
        metavar="ENGINE",
        help="a rollout engine, repeatable, e.g. vllm-fa3:chunk=256,cascade=512 "
        "(default: the kernel vLLM's selector picks on --gpu, as check --gpu predicts: FA3 -> vllm-fa3, FA2 -> vllm)",
    )


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The random inputs (seed, vocabulary) and where and how the report goes."""
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and LM head (default 0)")
    p.add_argument(
        "--vocab",
        type=int,
        default=drift_shape.DEFAULT_VOCAB,
        help=f"vocabulary of the random LM head (default {drift_shape.DEFAULT_VOCAB})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for drift-report.json and drift-heatmap.png "
        "(default: the config's report dir, <logger.log_dir>/attention_align)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG heatmap")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _prepare(args: argparse.Namespace) -> tuple[Sweep, dict[str, Any]]:
    """Everything checked before any numeric work: the sweep, and the report's head (the config, its
    overrides, why the default engines were picked)."""
    from nemo_rl_attn_align.cli.check import split_config_and_overrides
    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.kernels.gpu import parse_gpu
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
    from nemo_rl_attn_align.vocab.errors import UsageError

    config_path, overrides = split_config_and_overrides(args.args)
    cfg = load_config(config_path, overrides)
    settings = load_settings(cfg)
    args.out = check_out_dir(Path(settings.report_dir) if args.out is None else args.out)
    flags = {
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "window": args.window,
        "seq_len": args.seq_len,
    }
    facts = read_recipe_facts(cfg)
    facts.require_usable_model()
    shape = drift_shape.resolve_shape(facts, flags)
    dtypes = drift_shape.parse_dtypes(args.dtypes)
    gpu = parse_gpu(args.gpu)
    predicted_training, predicted_rollout = drift_shape.default_engines(facts, gpu, shape)
    notes = [*predicted_rollout.notes(), *predicted_training.notes()]
    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "drift needs torch, which is not installed. Fix: pip install torch "
            "(or pip install 'nemo-rl-attn-align[mcore]')."
        )
    from nemo_rl_attn_align.drift import sweep as drift

    training = drift.parse_materializers(args.training or list(predicted_training.specs), "--training")
    rollout = drift.parse_materializers(args.rollout or list(predicted_rollout.specs), "--rollout")
    drift.check_materializers([*training, *rollout], shape, gpu)
    if args.vocab < 2:
        raise UsageError(f"--vocab {args.vocab}: the LM head needs at least 2 tokens. Fix: pass --vocab 512.")
    notes = notes if not (args.training and args.rollout) else []
    sweep = drift.Sweep(shape, dtypes, training, rollout, gpu=gpu, seed=args.seed, vocab=args.vocab)
    return sweep, {"config": str(config_path), "overrides": overrides, "default_engines": notes}


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_out_dir(out: Path) -> Path:
    """``out`` normalized (``X/../Y`` is ``Y``), once it is known that it is or can become a
    writable directory: its nearest existing ancestor must be a writable directory. UsageError otherwise."""
    from nemo_rl_attn_align.vocab.errors import UsageError
    from nemo_rl_attn_align.vocab.limits import shown_path

    fix = "Fix: pass a directory that exists or can be created (--out DIR)."
    try:
        out = Path(os.path.normpath(out))
        probe = out
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            where = "is a file" if probe == out else f"cannot be created: {shown_path(probe)} is a file"
            raise UsageError(f"--out {shown_path(out)} {where}. {fix}")
        if not probe.exists():
            raise UsageError(f"--out {shown_path(out)} cannot be created: {shown_path(probe)} is a broken link. {fix}")
        longest = max((part for part in out.parts), key=lambda part: len(os.fsencode(part)), default="")
        if len(os.fsencode(longest)) > _name_max(probe):
            raise UsageError(
                f"--out {shown_path(out)}: a path component is {len(os.fsencode(longest))} bytes, "
                f"over the file system's limit of {_name_max(probe)}. {fix}"
            )
        try:  # a real test, leaving nothing behind: os.access does not know every file system's rules
            os.rmdir(tempfile.mkdtemp(prefix=".drift-out-check-", dir=probe))
        except OSError as err:
            raise UsageError(
                f"--out {shown_path(out)} cannot be created in {shown_path(probe)}: {err.strerror or err}. {fix}"
            ) from None
    except (OSError, ValueError) as err:  # name too long, NUL in the path, symlink loop
        raise UsageError(
            f"--out {shown_path(out)} is not usable: {getattr(err, 'strerror', None) or err}. {fix}"
        ) from None
    return out


def run(args: argparse.Namespace) -> int:
    """Handler of ``drift``; returns the exit code."""
    from nemo_rl_attn_align.vocab.errors import UsageError
    from nemo_rl_attn_align.vocab.limits import shown_text

    try:
        sweep, head = _prepare(args)
    except UsageError as err:
        print(f"error: {shown_text(str(err), 2000)}", file=sys.stderr)
        return EXIT_UNUSABLE
    from nemo_rl_attn_align.drift import drift_render
    from nemo_rl_attn_align.drift import sweep as drift
    from nemo_rl_attn_align.report.store import atomic_write_json

    result = {**head, **drift.run_sweep(sweep, drift.Progress(0, enabled=not args.no_progress))}
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # changed since it was checked
        print(f"error: --out {args.out} cannot be created now: {err.strerror or err}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = args.out / REPORT_NAME
    result["report"] = str(report)
    result["heatmap"] = None
    if not args.no_plot:
        result["heatmap"] = drift_render.write_heatmap(result, args.out / HEATMAP_NAME)
        if result["heatmap"] is None:
            print(
                "note: matplotlib is not installed (pip install 'nemo-rl-attn-align[plot]'); no heatmap written",
                file=sys.stderr,
            )
    atomic_write_json(report, result)
    if args.json:
        print(jsonio.dumps(result))
    else:
        notes = (f"default engines: {note}" for note in head["default_engines"])
        print("\n".join([*notes, drift_render.render_table(result)]))
        print(f"report: {report}" + (f"\nheatmap: {result['heatmap']}" if result["heatmap"] else ""))
    return EXIT_OK
