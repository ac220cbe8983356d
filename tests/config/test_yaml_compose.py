"""The libyaml path of ``compose_yaml`` gives what OmegaConf's pure-Python loader gives, or steps aside."""

from __future__ import annotations

import io
import math
import os
import random
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

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


def yaml_error(err: Exception):
    """A PyYAML error by what it says and where (the stream's name aside: ``<file>`` in OmegaConf)."""
    marks = [getattr(err, name, None) for name in ("context_mark", "problem_mark")]
    where = [(mark.line, mark.column) for mark in marks if mark is not None]
    return type(err).__name__, getattr(err, "context", None), getattr(err, "problem", str(err)), where


def omegaconf_outcome(text: str):
    """What ``OmegaConf.load`` (NeMo-RL's reader, public API) makes of ``text``: a container or its error."""
    try:
        return OmegaConf.to_container(OmegaConf.load(io.StringIO(text)))
    except yaml.YAMLError as err:
        return yaml_error(err)
    except Exception as err:  # OmegaConf's own refusal of a value or key, a constructor's ValueError
        return "other", type(err).__name__


def our_outcome(text: str, use_libyaml: bool):
    """The same through ``compose_yaml`` and ``OmegaConf.create``, for a document that is a mapping."""
    try:
        value, _ = compose_yaml(text, use_libyaml=use_libyaml)
    except OverLimit:
        return None
    except yaml.YAMLError as err:
        return yaml_error(err)
    except Exception as err:
        return "other", type(err).__name__
    if not isinstance(value, dict):
        return None
    try:
        return OmegaConf.to_container(OmegaConf.create(value))
    except Exception as err:
        return "other", type(err).__name__


def test_omegaconf_load_reads_every_example_and_generated_document_the_same():
    """The rules are OmegaConf's (no private import of its loader): every shipped example and
    thousands of generated documents give what ``OmegaConf.load`` gives, value or error."""
    texts = [path.read_text() for path in sorted(EXAMPLES.glob("*.yaml"))]
    rnd = random.Random(40)
    texts += ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(1, 25))) for _ in range(5_000)]
    texts += [
        "a: 1e3\nb: 2001-12-14\nc: .inf\nd: 1_000.5\ne: 0x1F\nf: yes\n",
        "a: 1\na: 2\n",
        "a: !!python/name:os.system\n",
    ]
    compared = 0
    for text in texts:
        for use_libyaml in (True, False):
            ours = our_outcome(text, use_libyaml)
            if ours is None:
                continue
            compared += 1
            assert ours == omegaconf_outcome(text), repr(text)
    assert compared > 4_000


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
