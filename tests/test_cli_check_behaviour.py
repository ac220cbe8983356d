"""``check``'s behaviour preview where no host is installed (the base lane): ``rope``, ``mask`` and
``softmax`` stay pending and a note names the options that compute them; ``--training-python`` /
``--rollout-python`` are checked before anything runs; ``--behaviour`` in a Python without the hosts
says so per side; and the preview binds what a host computed (``RecipeFacts.behaviour``) exactly as
the run binds its records. The hosts themselves: tests/real_nemo_rl/test_megatron_behaviour.py,
tests/real_vllm/test_behaviour_preview.py and tests/real_cross_engine/test_check_behaviour.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from nemo_rl_attn_align.binding.binding_preview import preview_binding
from nemo_rl_attn_align.cli.check import evaluate
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.config.settings import load_settings
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.preflight.behaviour_facts import ComputedBehaviour
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS, mask, per_layer
from nemo_rl_attn_align.vocab.codes import Code
from tests.behaviour_samples import MASK, ROPE, SOFTMAX

from .conftest import EXAMPLES, REPO, cli_in_fresh_process

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
SFT = EXAMPLES / "sft_megatron_flash.yaml"
HOSTS = {"training": "megatron.bridge", "rollout": "vllm"}


def check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, **env},
    )


def _no_hosts_here() -> None:
    import importlib.util

    if any(importlib.util.find_spec(m.split(".")[0]) and importlib.util.find_spec(m) for m in HOSTS.values()):
        pytest.skip("this Python has Megatron-Bridge or vLLM (a lane venv): the base lane's case is without them")


def test_without_a_host_the_behaviour_stays_pending_and_a_note_names_the_options():
    result = evaluate(GRPO, [], environ={})
    assert result["behaviour"] is None
    preview = result["attention_align"]
    for side, flag in (("training", "--training-python"), ("rollout", "--rollout-python")):
        for name in BEHAVIOUR_FIELDS:
            field = preview[side]["fields"][name]
            assert field["provenance"] == "pending", field
            assert f"check {flag} PY computes it before launch" in field["source"]
    [note] = [n for n in preview["notes"] if n.startswith("rope, mask and softmax pending")]
    assert "check --training-python PY --rollout-python PY" in note and "--behaviour" in note


@pytest.mark.parametrize("flag", ["--training-python", "--rollout-python"])
def test_an_interpreter_that_is_no_executable_is_one_line_naming_the_flag(flag, tmp_path):
    done = check(str(GRPO), flag, str(tmp_path / "no-python"))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {flag} {tmp_path / 'no-python'}: not an executable file; give the Python")


def test_a_given_interpreter_without_its_host_is_one_line_and_exit_2():
    _no_hosts_here()
    done = check(str(GRPO), "--training-python", sys.executable)
    assert done.returncode == 2, done.stdout[-2000:]
    [line] = done.stderr.splitlines()
    assert line == f"error: --training-python {sys.executable}: {sys.executable} has no megatron.bridge: give the " + (
        "interpreter of a venv with Megatron-Bridge"
    )


def test_behaviour_in_a_python_without_the_hosts_says_so_per_side_and_changes_no_verdict():
    _no_hosts_here()
    done = check(str(GRPO), "--behaviour", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for side, flag in (("training", "--training-python"), ("rollout", "--rollout-python")):
        shown = result["behaviour"][side]
        assert shown["python"] == sys.executable and shown["host"] is None
        assert shown["why_not"] == f"this Python has no {HOSTS[side]}; pass {flag} PY"
        field = result["attention_align"][side]["fields"]["rope"]
        assert field["provenance"] == "pending" and shown["why_not"] in field["source"]
    assert result["verdict"] == "ok"


def test_behaviour_imports_no_host_in_checks_process():
    """Finding whether this Python has each host imports none of it (``megatron`` included)."""
    _no_hosts_here()
    printed, imported = cli_in_fresh_process("check", str(GRPO), "--behaviour")
    assert imported == []
    assert "training rope, mask and softmax not computed" in printed  # the host lookup ran


def test_a_recipe_without_a_rollout_computes_the_training_side_only():
    _no_hosts_here()
    result = evaluate(SFT, [], environ={}, behaviour={"training": None, "rollout": None})
    assert set(result["behaviour"]) == {"training"}


@pytest.fixture
def stand_in(tmp_path) -> str:
    """An executable standing in for a host venv's interpreter (``tests/stand_in_host_python.py``)."""
    path = tmp_path / "stand-in-python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "stand_in_host_python.py"}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def _with_stand_ins(stand_in: str, **env: str) -> tuple[int, dict]:
    done = check(str(GRPO), "--training-python", stand_in, "--rollout-python", stand_in, "--json", **env)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def test_each_sides_interpreter_gets_its_side_and_what_it_computed_is_bound(stand_in):
    code, result = _with_stand_ins(stand_in)
    assert code == 0, result["attention_align"]["binding"]["findings"]
    for side, engine in (("training", "megatron-bridge"), ("rollout", "vllm")):
        shown = result["behaviour"][side]
        assert shown["python"] == stand_in and shown["computed"] == sorted(BEHAVIOUR_FIELDS), shown
        [given] = shown["substitutions"]  # what the stand-in was run with: the module, the side, the model
        module, got_engine, model = given.split(" ")
        assert (module, got_engine) == ("nemo_rl_attn_align.hosts.behaviour_preview", engine)
        assert "models--Qwen--Qwen2.5-1.5B" in model  # the directory of the config.json check read
        field = result["attention_align"][side]["fields"]["mask"]
        assert field["provenance"] == "configured" and field["value"] == MASK, field
    statuses = {r["field"]: r["status"] for r in result["attention_align"]["binding"]["fields"]}
    assert all(statuses[name] == "match" for name in BEHAVIOUR_FIELDS)


def test_a_wider_training_window_computed_by_its_interpreter_stops_the_recipe(stand_in):
    code, result = _with_stand_ins(stand_in, ATTN_ALIGN_STAND_IN_WINDOW="64")
    assert code == 1 and result["verdict"] == "violation"
    [finding] = [f for f in result["attention_align"]["binding"]["findings"] if f["code"] == "ATTN_BEHAVIOUR_MISMATCH"]
    assert finding["message"].startswith(
        "mask: layer 0: from query position 65 on, the training kernel sees 65 tokens, the rollout kernel every "
        "earlier token"
    )


def test_a_host_that_crashes_leaves_its_fields_pending_with_its_last_line(stand_in):
    code, result = _with_stand_ins(stand_in, ATTN_ALIGN_STAND_IN_FAIL="1")
    assert code == 0 and result["verdict"] == "ok"
    why = "exit 1: RuntimeError: the stand-in host crashed"
    assert result["behaviour"]["training"]["why_not"] == why
    assert result["attention_align"]["training"]["fields"]["rope"]["source"] == f"not computed by {stand_in}: {why}"


def _computed(side: str, **fields) -> ComputedBehaviour:
    values = {
        name: FieldValue.observed(value, f"{name} as the reader read it").to_dict() for name, value in fields.items()
    }
    return ComputedBehaviour(side, f"/venvs/{side}/bin/python", host=f"{side}-host (host 1.0)", fields=values)


def _preview(training: ComputedBehaviour, rollout: ComputedBehaviour):
    cfg = load_config(GRPO, [])
    facts = dataclasses.replace(read_recipe_facts(cfg, {}), behaviour=(training, rollout))
    return preview_binding(facts, load_settings(cfg), {})


def test_what_the_hosts_computed_is_configured_and_bound_as_the_records_are():
    preview = _preview(
        _computed("training", rope=ROPE, mask=MASK, softmax=SOFTMAX),
        _computed("rollout", rope=ROPE, mask=MASK, softmax=SOFTMAX),
    )
    field = preview.training.fields["mask"]
    assert field.provenance.value == "configured" and field.value == MASK
    assert field.source.startswith("computed by training-host (host 1.0) here, from ")
    assert field.source.endswith("config.json: mask as the reader read it")
    binding = preview.binding
    assert all(binding.result(name).status.value == "match" for name in BEHAVIOUR_FIELDS)
    assert binding.result("sliding_window").explained_by == "mask"
    assert "identity" not in binding.failed_tiers  # a measured behaviour explains its configuration
    assert any(note.startswith("training rope, mask and softmax computed by training-host") for note in preview.notes)


def _windowed(window: int) -> dict:
    return mask(per_layer({0: {"causal": True, "window": window}, 1: {"causal": True, "window": None}}), "sample")


def test_a_window_one_token_wider_in_training_fails_the_identity_tier_before_launch():
    preview = _preview(
        _computed("training", rope=ROPE, mask=_windowed(4096), softmax=SOFTMAX),
        _computed("rollout", rope=ROPE, mask=_windowed(4095), softmax=SOFTMAX),
    )
    [finding] = [f for f in preview.binding.findings() if f.code is Code.ATTN_BEHAVIOUR_MISMATCH]
    assert "mask: layer 0: from query position 4096 on, the training kernel sees 4097 tokens" in finding.message
    assert "the window is off by one" in finding.fix
    assert "add the override ++policy.megatron_cfg.model_overrides.window_size=[4095,0]" in finding.fix  # as typed
    assert "identity" in preview.binding.failed_tiers


def test_a_side_not_computed_leaves_its_fields_pending_with_the_reason():
    reason = "the host could not build the model: ValueError: no"
    preview = _preview(
        ComputedBehaviour("training", "/py", why_not=reason),
        _computed("rollout", rope=ROPE, mask=MASK, softmax=SOFTMAX),
    )
    for name in BEHAVIOUR_FIELDS:
        assert preview.training.fields[name].provenance.value == "pending"
        assert preview.training.fields[name].source == f"not computed by /py: {reason}"
    assert f"training rope, mask and softmax not computed (/py): {reason}" in preview.notes
