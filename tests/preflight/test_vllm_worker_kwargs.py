"""A ``policy.generation.vllm_kwargs`` key NeMo-RL's vLLM worker passes to vLLM itself is stopped
before the run (issue #40, item 7), at every NeMo-RL ref the table was read from
(``tests/real_nemo_rl/test_vllm_worker_kwargs.py`` regenerates the table from those refs' sources)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.preflight import vllm_worker_kwargs
from nemo_rl_attn_align.preflight.facts import read_policy_facts
from nemo_rl_attn_align.preflight.rules import evaluate
from nemo_rl_attn_align.vocab.codes import Code
from tests.preflight.test_rules import policy

TABLE = vllm_worker_kwargs.table()
REFS = TABLE["refs"]
#: Engine arguments no ref passes itself: a recipe may set them.
FREE = ("block_size", "max_num_seqs", "attention_backend", "enable_chunked_prefill", "hf_overrides")


def passed_twice(policy_cfg, nemo_rl_version):
    facts = dataclasses.replace(read_policy_facts(policy_cfg, {}), nemo_rl_version=nemo_rl_version)
    return [f for f in evaluate(facts) if f.code is Code.VLLM_KWARG_PASSED_TWICE]


def test_the_table_holds_every_ref_and_main_first():
    assert list(REFS) == ["7ea279a", "v0.7.0", "v0.6.0", "v0.5.0"] and TABLE["main"] == "7ea279a"
    for entry in REFS.values():
        assert {"model", "dtype", "seed", "max_model_len"} <= set(entry["keys"])
        assert not set(FREE) & set(entry["keys"])


@pytest.mark.parametrize("ref", list(REFS))
def test_every_key_a_ref_passes_itself_is_stopped_at_that_refs_version(ref):
    version = REFS[ref]["version"]
    for key, source in REFS[ref]["keys"].items():
        [found] = passed_twice(policy(**{f"generation__vllm_kwargs__{key}": 1}), version)
        assert found.key == f"policy.generation.vllm_kwargs.{key}" and found.value == 1
        assert ref in found.message and "TypeError" in found.message
        assert found.fix.startswith(f"remove policy.generation.vllm_kwargs.{key};")
        assert (f"policy.generation.{source}" in found.fix) if source else ("sets it itself" in found.fix)
    for key in FREE:
        assert passed_twice(policy(**{f"generation__vllm_kwargs__{key}": 1}), version) == []


def test_the_refs_differ_and_the_installed_version_decides():
    """Main (7ea279a) sets ``logprobs_mode`` after the call; v0.5.0 to v0.7.0 pass it inside it.
    Main reports the version 0.6.0, as v0.6.0 does: that version gets both refs' keys."""
    logprobs = policy(generation__vllm_kwargs__logprobs_mode="raw_logprobs")
    assert passed_twice(logprobs, None) == []  # not installed: main's
    for version in ("0.7.0", "0.5.0rc0", "0.5.0"):
        [found] = passed_twice(logprobs, version)
        assert f"NeMo-RL {version} (v0.{version[2]}.0)" in found.message
    [found] = passed_twice(logprobs, "0.6.0")
    assert "NeMo-RL 0.6.0 (7ea279a or v0.6.0)" in found.message
    [found] = passed_twice(policy(generation__vllm_kwargs__seed=3), "9.9.9")
    assert "NeMo-RL main at 7ea279a (the installed 9.9.9 is none of 7ea279a, v0.7.0, v0.6.0, v0.5.0)" in found.message


def test_only_where_nemo_rl_generates_with_vllm():
    for backend in ("megatron", "sglang"):
        assert passed_twice(policy(generation__backend=backend, generation__vllm_kwargs__seed=1), None) == []


def test_check_stops_it_before_the_run(capsys):
    assert main(["check", "++policy.generation.vllm_kwargs.seed=7", "++policy.generation.vllm_kwargs.dtype=half"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "VLLM_KWARG_PASSED_TWICE" in line]
    assert [line.split(":")[1].strip() for line in lines] == [
        "policy.generation.vllm_kwargs.seed=7",
        "policy.generation.vllm_kwargs.dtype='half'",
    ]


def test_where_nemo_rl_is_not_installed_nothing_is_imported_to_say_so():
    vllm_worker_kwargs.installed_nemo_rl.cache_clear()
    before = set(sys.modules)
    assert vllm_worker_kwargs.installed_nemo_rl() is None
    assert not {name for name in set(sys.modules) - before if name.startswith(("importlib.metadata", "nemo_rl."))}
