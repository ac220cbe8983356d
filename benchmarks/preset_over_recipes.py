"""``attention_align.preset: aligned`` over every NeMo-RL recipe YAML in a NeMo-RL checkout.

    python benchmarks/preset_over_recipes.py PATH/TO/NeMo-RL [--json]

For each ``examples/configs/**/*.yaml`` it loads the recipe as ``check`` does, with
``++attention_align.preset=aligned``, and sorts it: ``aligned`` (the preview's semantic and
determinism tiers pass), ``refused`` (one finding says why it cannot be aligned, counted by its
key), ``no rollout side`` (nothing to bind: no vLLM generation or no Megatron training), or
``unloadable`` (the loader refused it: a fragment, or one that needs overrides). Prints the counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def classify(path: Path) -> tuple[str, str]:
    """``(outcome, detail)`` for one recipe."""
    from nemo_rl_attn_align.aligning.preset import align
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
    from nemo_rl_attn_align.vocab.errors import UsageError

    try:
        cfg = load_config(path, ["++attention_align.preset=aligned"])
        settings = load_settings(cfg)
        alignment = align(cfg, lambda c: read_recipe_facts(c, {}), lambda facts: preview_binding(facts, settings, {}))
    except UsageError as err:
        return "unloadable", str(err)[:120]
    if alignment.preview.binding is None:
        return "no rollout side", ""
    if alignment.refusal is not None:
        return "refused", alignment.refusal.key
    return "aligned", ", ".join(c.key.rsplit(".", 1)[-1] for c in alignment.changes)


def sweep(root: Path) -> dict[str, collections.Counter]:
    """Outcome counts (and, per outcome, the details) over ``root/examples/configs``."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in sorted((root / "examples" / "configs").rglob("*.yaml")):
        outcome, detail = classify(path)
        counts[outcome][detail] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nemo_rl", type=Path, help="a NeMo-RL checkout (holds examples/configs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = sweep(args.nemo_rl)
    if args.json:
        print(json.dumps({k: dict(v) for k, v in counts.items()}, indent=2))
        return 0
    total = sum(sum(c.values()) for c in counts.values())
    print(f"{total} recipe YAMLs under {args.nemo_rl / 'examples' / 'configs'}")
    for outcome in ("aligned", "refused", "no rollout side", "unloadable"):
        details = counts.get(outcome, collections.Counter())
        print(f"  {outcome}: {sum(details.values())}")
        if outcome in ("aligned", "refused"):
            for detail, n in details.most_common():
                print(f"    {n:4d}  {detail or '(no change needed)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
