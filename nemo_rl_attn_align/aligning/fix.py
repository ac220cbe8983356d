"""``check --fix``: the smallest set of the preset's changes (and those it refuses) that still aligns.

``minimal`` drops each change of an ``Alignment`` (``preset.align(cfg, alter_ok=True)``) in turn
while the rest keep the preview free of blocking causes and the pre-flight rules free of new
errors. Stdlib only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from nemo_rl_attn_align.aligning.preset import Alignment, blocking_causes, set_key
from nemo_rl_attn_align.preflight.plan import build_plan
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.vocab.change import Change


def minimal(
    cfg: Mapping[str, Any],
    alignment: Alignment,
    read: Callable[[Mapping[str, Any]], RecipeFacts],
    preview_of: Callable[[RecipeFacts], Any],
) -> tuple[Change, ...]:
    """The smallest subset of ``alignment.changes`` after which the preview still has no blocking
    cause and the pre-flight rules find no error the whole set does not (each change is dropped in
    turn when the rest suffice: batch-invariant mode without its flash-attn pin would not start; the
    kernel step's changes are kept). ``read`` reads a config's facts (with the driver environment
    ``check`` was given), once per trial; ``preview_of`` previews them."""

    def changed(changes: list[Change]) -> dict[str, Any]:
        work = copy.deepcopy(dict(cfg))
        for c in changes:
            set_key(work, c.key, c.value)
        return work

    def rule_errors(facts: RecipeFacts) -> set[str]:
        return {f.code.value for f in build_plan(facts).errors}

    kept = list(alignment.changes)
    chosen = alignment.kernels.changes if alignment.kernels is not None else ()
    allowed = rule_errors(alignment.facts)  # the facts of every change applied
    for change in [c for c in kept if c not in chosen]:  # the kernel step's changes are its fewest already
        trial = [c for c in kept if c is not change]
        facts = read(changed(trial))
        if not blocking_causes(preview_of(facts)) and rule_errors(facts) <= allowed:
            kept = trial
    return tuple(kept)
