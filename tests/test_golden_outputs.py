"""``check --json`` and ``report --json`` print today what they printed when ``tests/golden_outputs.py``
last wrote them: over the shipped examples and every NeMo-RL recipe, with and without a GPU, and the
preset's ``--fix``. A refactoring changes none of it; a change of behaviour rewrites them on purpose."""

from __future__ import annotations

import difflib

import pytest

from tests import golden_outputs

pytestmark = pytest.mark.slow


def _first_differences(expected: dict[str, str], actual: dict[str, str], limit: int = 3) -> str:
    """A unified diff of the first ``limit`` cases that differ."""
    lines = []
    changed = [case for case in sorted(expected.keys() | actual.keys()) if expected.get(case) != actual.get(case)]
    for case in changed[:limit]:
        diff = difflib.unified_diff(
            (expected.get(case) or "<absent>\n").splitlines(), (actual.get(case) or "<absent>\n").splitlines(),
            "golden", "now", n=2, lineterm="",
        )  # fmt: skip
        lines += [f"== {case}", *list(diff)[:40]]
    return f"{len(changed)} of {len(expected)} outputs differ; the first:\n" + "\n".join(lines)


def test_check_and_report_print_what_they_printed(example_model_cache):
    if example_model_cache is None:
        pytest.skip("transformers is needed to write the example models")
    golden = golden_outputs.read_golden()
    if golden_outputs.recipe_root() is None:  # a user's checkout without NeMo-RL's sources: the rest
        golden = {case: text for case, text in golden.items() if not case.startswith("nemo-rl/")}
    actual = golden_outputs.all_outputs(example_model_cache)
    assert actual == golden, _first_differences(golden, actual)


def test_the_outputs_cover_every_recipe_and_every_exit_code():
    golden = golden_outputs.read_golden()
    assert sum(case.startswith("nemo-rl/recipes/llm/") for case in golden) > 400
    exit_codes = {text.rsplit("\nexit ", 1)[1][0] for text in golden.values()}
    assert exit_codes == {"0", "1", "2"}
    assert any('"KERNEL_PAIR_DOCUMENTED"' in text for text in golden.values())
