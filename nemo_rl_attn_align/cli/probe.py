"""``nemo-rl-attn-align probe REFERENCE_SIDE OTHER_SIDE [options]``: two engines' forward on one
batch, compared layer by layer (``nemo_rl_attn_align.probe``).

Each side file is a JSON object (``probe/sides.py``); each side runs in its own process and the
second also runs its attention on the first's query/key/value, which measures attention's share.
Prints the verdict and the per-layer table (or ``--json``); ``--plot`` writes divergence by layer.
Exit 0: done; 2: unusable input. Nothing heavy is imported before the input is checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_UNUSABLE = 0, 2


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
    p.add_argument("reference", type=Path, metavar="REFERENCE_SIDE", help="side file of the training side (JSON)")
    p.add_argument("other", type=Path, metavar="OTHER_SIDE", help="side file of the side compared with it (JSON)")
    p.add_argument("--prompts", type=Path, help="JSON list of token-id lists (default: a fixed batch of two)")
    p.add_argument("--layers", help="comma-separated layer indices to compare (default: every layer)")
    p.add_argument("--atol", type=float, default=0.0, help="a difference above this diverges (default 0: exact)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--plot", type=Path, help="write divergence by layer to this PNG (needs matplotlib)")
    p.add_argument("--out", type=Path, help="keep the side files and captures in this directory")
    p.set_defaults(handler=run)


def _layers(text: str | None) -> list[int] | None:
    from nemo_rl_attn_align.vocab.errors import UsageError

    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--layers {text!r}: not comma-separated layer indices; e.g. --layers 0,3,11") from None


def run(args: argparse.Namespace) -> int:
    """Handler of ``probe``; returns the exit code."""
    from nemo_rl_attn_align.probe import driver, sides
    from nemo_rl_attn_align.vocab.errors import UsageError

    try:
        if args.atol < 0:
            raise UsageError(f"--atol {args.atol}: a tolerance is 0 or more; e.g. --atol 1e-6")
        sequences = sides.read_prompts(args.prompts) if args.prompts else sides.DEFAULT_SEQUENCES
        reference, other, layers = (
            sides.SideSpec.read(args.reference),
            sides.SideSpec.read(args.other),
            _layers(args.layers),
        )
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
        print(json.dumps({"verdict": render.verdict(result), **result.to_dict()}))
    else:
        print(render.verdict(result))
        print(render.table(result))
    return EXIT_OK
