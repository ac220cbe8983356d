"""``nemo-rl-attn-align examples [NAME]``: where the packaged example recipes are.

Each example is a complete NeMo-RL recipe shipped inside the installed package, so the path is what
``examples/run_grpo.py --config`` (inside a NeMo-RL checkout) and ``check`` take. With NAME, prints
that example's absolute path (exit 0) or says which names exist (exit 2); without, lists them all.
"""

from __future__ import annotations

import sys

from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE


def register(subparsers) -> None:
    """Add the ``examples`` parser."""
    parser = subparsers.add_parser(
        "examples",
        help="print the path of a packaged example recipe (or list them)",
        description="Print the absolute path of a packaged example recipe, for --config of NeMo-RL's "
        "run_grpo.py / run_sft.py or for check. Without NAME, list every example.",
    )
    parser.add_argument(
        "name", nargs="?", metavar="NAME", help="an example file name, e.g. grpo_math_1B_megatron_flash.yaml"
    )
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Print one example's path, or all of them."""
    from nemo_rl_attn_align.config.example_recipes import example_paths

    paths = {path.name: path for path in example_paths()}
    if args.name is None:
        for path in paths.values():
            print(path)
        return EXIT_OK
    wanted = args.name if args.name.endswith(".yaml") else f"{args.name}.yaml"
    if wanted not in paths:
        print(f"examples: {args.name!r} is not a packaged example; choose one of {', '.join(paths)}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(paths[wanted])
    return EXIT_OK
