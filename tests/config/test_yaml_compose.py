"""The libyaml path of ``compose_yaml`` gives what OmegaConf's pure-Python loader gives, or steps aside."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
import yaml

from nemo_rl_attn_align.config import yaml_compose
from nemo_rl_attn_align.config.yaml_compose import OverLimit, compose_yaml
from nemo_rl_attn_align.vocab.limits import MAX_CONFIG_NODES, MAX_NESTING
from tests.conftest import EXAMPLES

SNAPSHOTS = os.environ.get("ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS")
needs_libyaml = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML is built without libyaml here")
#: Pieces of YAML, many of them significant, that generated documents are made of.
PIECES = [
    *":- \n\n  []{},#'\"&*|>%@`ab1.$0e+_\\x",
    "a: ",
    "- ",
    "\n  ",
    "${a.b}",
    "key: value\n",
    "  - x\n",
    "'q'",
    '"d\\n"',
    "1e3",
    "0x1F",
    "~",
    "null",
    "yes",
    "&a ",
    "*a",
    "<<: *a\n",
    "---\n",
    "...\n",
    "|\n  ",
    ">-\n  ",
]


def same(a, b) -> bool:
    """Equal values of equal types, NaN equal to NaN (``.nan`` is a YAML float)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def outcome(text: str, use_libyaml: bool):
    try:
        return compose_yaml(text, use_libyaml=use_libyaml)
    except Exception as err:  # PyYAML's errors, OverLimit, a constructor's ValueError
        return type(err).__name__, str(err)


def libyaml_only(text: str):
    """What the libyaml loader alone makes of ``text`` (None when it fails)."""
    _, libyaml_loader = yaml_compose._loader_classes()
    try:
        return yaml_compose._compose_with(libyaml_loader, text, 0)
    except Exception:
        return None


@needs_libyaml
def test_the_libyaml_path_is_taken_for_a_plain_recipe(monkeypatch):
    taken = []
    real = yaml_compose._compose_with
    monkeypatch.setattr(yaml_compose, "_compose_with", lambda cls, *a: taken.append(cls.__name__) or real(cls, *a))
    compose_yaml((EXAMPLES / "grpo_math_1B_megatron_flash.yaml").read_text())
    compose_yaml("note: caf\u00e9\n")  # not ASCII: left to Python
    assert taken == ["BoundedOmegaConfCLoader", "BoundedOmegaConfLoader"]


def test_every_shipped_example_composes_the_same_on_both_paths():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        text = path.read_text()
        assert same(outcome(text, True), outcome(text, False)), path.name


@pytest.mark.skipif(not SNAPSHOTS, reason="ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS is not set (.ci/run sets it)")
def test_every_nemo_rl_recipe_composes_the_same_on_both_paths():
    paths = sorted(Path(SNAPSHOTS).glob("*/examples/configs/**/*.yaml"))
    assert len(paths) > 100
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert same(outcome(text, True), outcome(text, False)), path


@needs_libyaml
def test_whatever_libyaml_accepts_python_builds_the_same():
    """Generated documents: where the libyaml path succeeds, the pure-Python one must give the same
    value and count (where they differ, ``_LEFT_TO_PYTHON`` has to send the text to Python)."""
    rnd = random.Random(20261202)
    accepted = 0
    for _ in range(20_000):
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(1, 25)))
        if yaml_compose._LEFT_TO_PYTHON.search(text):
            continue
        fast = libyaml_only(text)
        if fast is not None:
            accepted += 1
            assert same(fast, outcome(text, False)), repr(text)
    assert accepted > 2_000


@needs_libyaml
@pytest.mark.parametrize("text", ["!\n", "a: |#x\n", "[yes?1e3]\n"])
def test_where_libyaml_differs_the_text_goes_to_python(text):
    """Each of these was found by generating documents: libyaml reads them differently or accepts
    what PyYAML rejects."""
    assert yaml_compose._LEFT_TO_PYTHON.search(text)
    assert not same(libyaml_only(text), outcome(text, False))


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: 1\na: 2\n", "a:\n\t- 1\n", "x: *nope\n", "- a\nb: c\n"])
def test_errors_read_exactly_as_on_the_python_path(text):
    fast, slow = outcome(text, True), outcome(text, False)
    assert isinstance(slow, tuple) and slow[0] != "int"  # an error, not a value
    assert fast == slow


@pytest.mark.parametrize("use_libyaml", [True, False])
def test_limits_hold_on_both_paths(use_libyaml):
    deep = "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, MAX_NESTING + 3))
    with pytest.raises(OverLimit, match="nests deeper"):
        compose_yaml(deep, use_libyaml=use_libyaml)
    wide = "".join(f"k{i}: {i}\n" for i in range(MAX_CONFIG_NODES))
    with pytest.raises(OverLimit, match="more than"):
        compose_yaml(wide, use_libyaml=use_libyaml)
    assert compose_yaml("a: 1\n", 7, use_libyaml=use_libyaml) == ({"a": 1}, 10)
