"""Property-based: generated configs over every key the rules and settings read, through ``check``'s
own entry point, as YAML files and as Hydra overrides.

For every example: no exception escapes, the exit code is 0, 1 or 2, a usage error is one line,
``--json`` output parses with a strict parser (no NaN / Infinity) and no finding spans lines; and
when NeMo-RL, Megatron or the documented ``attention_align`` schema reject the config (the oracle
in ``tests/hostile_inputs.py``, written from the hosts' behaviour), the exit code is not 0. Kept
small for CI (a bounded number of examples, no deadline); ``benchmarks/fuzz_check.py`` runs tens of
thousands.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.preflight.expected_workers import expected_workers
from nemo_rl_attn_align.preflight.facts import COUNT_KEYS, LAYOUT
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.errors import UsageError

from . import hostile_inputs as hi

BASE = load_config(default_example_path())
BASE.pop("defaults", None)

#: Arbitrary JSON-like values beyond the pools: scalars of every type (NaN and infinities too),
#: odd strings, small nested lists and mappings.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["2", "2.0", "true", "yes", "flash", "bfloat16", "p2p", "x\ny"]),
)
ARBITRARY = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)


def _change(key: str):
    return st.tuples(st.just(key), st.sampled_from(hi.POOLS[key]) | ARBITRARY)


CHANGES = st.lists(st.sampled_from(sorted(hi.POOLS)).flatmap(_change), min_size=1, max_size=6).map(dict)

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _assert_sound(path: Path, overrides: list[str], as_json: bool) -> None:
    outcome = hi.run_check(path, overrides, as_json=as_json)
    assert outcome.problems == [], (outcome.problems, outcome.stdout[-500:], outcome.stderr[-500:])
    if outcome.exit_code != 0:
        return
    try:
        resolved = load_config(path, overrides)
    except UsageError as err:  # pragma: no cover - would already be a problem above
        raise AssertionError(f"check exited 0 but the loader refuses: {err}") from None
    why = hi.rejection(resolved)
    assert why is None, f"exit 0 for a config the host rejects ({why})"


@_SETTINGS
@given(changes=CHANGES, as_json=st.booleans())
def test_generated_yaml_files(changes, as_json):
    cfg = copy.deepcopy(BASE)
    for key, value in changes.items():
        hi.set_path(cfg, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        hi.write_config(path, cfg)
        _assert_sound(path, [], as_json)


@_SETTINGS
@given(changes=CHANGES, as_json=st.booleans())
def test_generated_overrides(changes, as_json):
    overrides = [f"~{k}" if hi.is_unset(v) else f"++{k}={hi.hydra_literal(v)}" for k, v in changes.items()]
    _assert_sound(default_example_path(), overrides, as_json)


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=40))
def test_any_override_text(text):
    """Whatever follows ``++policy.megatron_cfg.context_parallel_size=``: sound output, never a traceback."""
    _assert_sound(default_example_path(), [f"++policy.megatron_cfg.context_parallel_size={text}"], as_json=True)


def test_the_oracle_rejects_what_the_issue_found_accepted():
    """The oracle itself: each wrong verdict of issue 12 is a rejection (so the properties can fail)."""

    def with_(**changes):
        cfg = copy.deepcopy(BASE)
        for key, value in changes.items():
            hi.set_path(cfg, key.replace("__", "."), value)
        return hi.rejection(cfg)

    mcfg = "policy__megatron_cfg__"
    for value in ("2", 2.0, 0, -1, True):
        assert with_(**{f"{mcfg}context_parallel_size": value})
        assert with_(**{f"{mcfg}tensor_model_parallel_size": value})
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        assert "KeyError" in with_(**{f"{mcfg}{key}": hi.UNSET})
    assert with_(**{f"{mcfg}transformer_impl": "TE"})
    assert with_(**{"policy__megatron_cfg": "flash"})
    assert with_(**{f"{mcfg}model_overrides__batch_invariant_mode": 1, f"{mcfg}attention_backend": "fused"})
    for value in (True, "32", 2.0):
        assert with_(attention_align__drift__heads=value)
    assert with_() is None and with_(**{f"{mcfg}context_parallel_size": 2}) is None


#: Each spelling YAML (YAML 1.1, as OmegaConf reads a file) or Hydra's override grammar reads as a boolean.
_BOOLEAN_SPELLINGS = st.sampled_from(
    [("yaml", word) for word in ("true", "yes", "on", "True", "false", "no", "off")]
    + [("override", word) for word in ("true", "false", "True")]
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(COUNT_KEYS)), spelling=_BOOLEAN_SPELLINGS)
def test_no_boolean_is_taken_as_a_number(key, spelling):
    """Every count or size the facts read (``facts.COUNT_KEYS``) set to a boolean, in any spelling:
    a finding names the key; an error (exit 1) where NeMo-RL's worker layout fails on a boolean, a
    ``NUMBER_IS_BOOLEAN`` warning where the host would read it as 1 or 0."""
    form, word = spelling
    cfg = copy.deepcopy(BASE)
    if key.startswith("generation.mcore_"):
        hi.set_path(cfg, "policy.generation.backend", "megatron")
    dotted = f"policy.{key}"
    with tempfile.TemporaryDirectory() as tmp:
        path, overrides = Path(tmp) / "c.yaml", []
        if form == "yaml":
            hi.set_path(cfg, dotted, "__BOOLEAN__")
            hi.write_config(path, cfg)
            path.write_text(path.read_text().replace("__BOOLEAN__", word))
        else:
            hi.write_config(path, cfg)
            overrides = [f"++{dotted}={word}"]
        outcome = hi.run_check(path, overrides, as_json=True)
    assert outcome.problems == [], outcome.problems
    findings = [f for f in json.loads(outcome.stdout)["plan"]["findings"] if f["key"] == dotted]
    assert findings and isinstance(findings[0]["value"], bool), (key, word, outcome.stdout[-800:])
    if COUNT_KEYS[key] == LAYOUT:
        assert findings[0]["code"] == "CONFIG_VALUE_INVALID" and outcome.exit_code == 1
    else:
        assert findings[0]["code"] == "NUMBER_IS_BOOLEAN" and findings[0]["severity"] == "warning"


class _Tracked(dict):
    """A config mapping that notes the dotted key of every integer read from it (``[]`` or ``.get``)."""

    def __init__(self, data: dict, path: str, seen: set[str]):
        super().__init__({k: _Tracked(v, f"{path}{k}.", seen) if isinstance(v, dict) else v for k, v in data.items()})
        self._path, self._seen = path, seen

    def _note(self, key, value):
        if isinstance(value, int) and not isinstance(value, bool):
            self._seen.add(f"{self._path}{key}")
        return value

    def __getitem__(self, key):
        return self._note(key, super().__getitem__(key))

    def get(self, key, default=None):
        return self._note(key, super().__getitem__(key)) if key in self else default


#: Integers of a recipe outside ``policy`` that the facts and the expected workers read, and why no
#: boolean is taken there as a number.
_READ_OUTSIDE_POLICY = {
    "grpo.num_prompts_per_step": "positive_int: a boolean is no count (the batch size stays unknown)",
    "grpo.num_generations_per_prompt": "positive_int: a boolean is no count (the batch size stays unknown)",
    "cluster.num_nodes": "a positive-int check: a boolean leaves the worker count unknown",
    "cluster.gpus_per_node": "a positive-int check: a boolean leaves the worker count unknown",
}


@pytest.mark.parametrize("backend", ["vllm", "megatron"])
def test_the_count_keys_are_every_integer_the_facts_read(backend):
    """``COUNT_KEYS`` is complete: reading the example recipe (every count key set) into its facts and
    its expected workers reads no other integer, so the property above covers every number read."""
    cfg = copy.deepcopy(BASE)
    hi.set_path(cfg, "policy.generation.backend", backend)
    for key in COUNT_KEYS:
        hi.set_path(cfg, f"policy.{key}", 1)
    seen: set[str] = set()
    tracked = _Tracked(cfg, "", seen)
    read_recipe_facts(tracked, {})
    expected_workers(tracked)
    assert "grpo.num_prompts_per_step" in seen  # the tracking sees reads beyond the count keys' own reader
    assert seen - {f"policy.{key}" for key in COUNT_KEYS} - set(_READ_OUTSIDE_POLICY) == set()
