"""The ``nemo-rl-attn-align`` command line.

Each sub-command lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and sets ``handler`` to a function ``(args) -> exit code``. Command modules
import nothing heavy at module level: ``check`` must stay well under a second.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nemo_rl_attn_align import __version__

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = ("check", "report", "drift", "run", "examples")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser. When ``argv`` starts with a sub-command's name only that one is
    registered (so ``check`` does not import what ``drift`` needs); otherwise all of them are."""
    chosen = [name for name in COMMANDS if argv and argv[0] == name] or list(COMMANDS)
    parser = argparse.ArgumentParser(
        prog="nemo-rl-attn-align",
        description="Attention-backend pre-flight checks and train/rollout attention contracts for NeMo-RL.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in chosen:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover - python -m nemo_rl_attn_align.cli
    sys.exit(main())
