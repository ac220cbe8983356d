"""``check --training-python --rollout-python`` end to end, as a user runs it before launch: the shipped
GRPO example pointed at a tiny local Mistral checkpoint (a sliding window), each side's ``rope``,
``mask`` and ``softmax`` computed by its host in its own venv (Megatron-Bridge in lane nemo_rl's,
vLLM in lane vllm's) and bound by the preview. As shipped they match; with Megatron-Bridge #2656
re-introduced into the training venv's bridge (a patched copy of its package first on the path of
that side's process: the shared venv is never touched) ``check`` stops the recipe (exit 1:
``on_mismatch`` identity is error by default) and names the window off by one at layer 0, and the
``model_overrides`` its fix line names make the recipe pass again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from tests.real_cross_engine.conftest import REPO

pytestmark = pytest.mark.real_cross_engine

#: Megatron-Bridge #2656's fix in its Mistral bridge (upstream commit 5fcab34f8), undone by the test.
FIX_2656 = "hf_config.sliding_window - 1"
MISTRAL_BRIDGE = Path("models") / "mistral" / "mistral_bridge.py"


@pytest.fixture(scope="module")
def mistral(pythons, tmp_path_factory) -> tuple[Path, int]:
    """A tiny random-weight Mistral checkpoint with its tokenizer (made by the training venv's
    transformers, ``tests/real_vllm/tiny_models.py``), and its ``sliding_window``."""
    directory = tmp_path_factory.mktemp("tiny-mistral")
    make = "import sys; from pathlib import Path; from tests.real_vllm.tiny_models import make_model; "
    make += "make_model(Path(sys.argv[1]), 'mistral')"
    subprocess.run(
        [pythons[0], "-c", make, str(directory)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return directory, json.loads((directory / "config.json").read_text())["sliding_window"]


def check(pythons, checkpoint: Path, *overrides: str, pythonpath: str | None = None) -> tuple[int, dict]:
    """``check --json`` on the shipped example on ``checkpoint`` with both sides' interpreters
    (``pythonpath``: what the check process's PYTHONPATH holds, after this plugin, on each side's path)."""
    command = [sys.executable, "-m", "nemo_rl_attn_align", "check", str(default_example_path())]
    command += [f"policy.model_name={checkpoint}", f"policy.tokenizer.name={checkpoint}", *overrides]
    command += ["--training-python", pythons[0], "--rollout-python", pythons[1], "--json"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": pythonpath} if pythonpath else {})
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def _computed(result: dict) -> None:
    for side, host in (("training", "Megatron-Bridge (megatron-bridge "), ("rollout", "vLLM (vllm")):
        shown = result["behaviour"][side]
        assert shown["why_not"] is None and shown["host"].startswith(host), shown
        assert shown["computed"] == sorted(BEHAVIOUR_FIELDS) and shown["problems"] == [], shown
        for name in BEHAVIOUR_FIELDS:
            field = result["attention_align"][side]["fields"][name]
            assert field["provenance"] == "configured" and field["source"].startswith(f"computed by {host}"), field


def test_the_example_on_a_mistral_checkpoint_computes_the_same_behaviour_on_both_sides(pythons, mistral):
    code, result = check(pythons, mistral[0])
    assert code == 0, result["attention_align"]["binding"]["findings"]
    _computed(result)
    binding = {r["field"]: r for r in result["attention_align"]["binding"]["fields"]}
    for name in BEHAVIOUR_FIELDS:
        assert binding[name]["status"] == "match", binding[name]["message"]
    window = mistral[1] - 1  # keys before the query: Hugging Face's sliding_window counts the query too
    assert result["attention_align"]["training"]["fields"]["mask"]["value"]["kinds"] == [
        {"causal": True, "window": window}
    ]


@pytest.fixture(scope="module")
def bridge_2656(pythons, tmp_path_factory) -> str:
    """A folder holding a copy of the training venv's ``megatron/bridge`` with #2656's fix undone in its
    Mistral bridge (``megatron`` is a namespace package: the copy first on the path is the one imported)."""
    where = subprocess.run(
        # found, not imported: Megatron-Bridge imports Transformer Engine, which lane nemo_rl's venv stands in for
        [
            pythons[0],
            "-c",
            "import importlib.util as u; print(*u.find_spec('megatron.bridge').submodule_search_locations)",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    root = tmp_path_factory.mktemp("bridge-2656")
    copy = root / "megatron" / "bridge"
    shutil.copytree(where, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / MISTRAL_BRIDGE).read_text()
    assert source.count(FIX_2656) == 1, "the installed Mistral bridge has no #2656 fix to undo"
    (copy / MISTRAL_BRIDGE).write_text(source.replace(FIX_2656, "hf_config.sliding_window"))
    return str(root)


def test_megatron_bridge_2656_reintroduced_stops_the_recipe_naming_the_window_off_by_one(pythons, mistral, bridge_2656):
    checkpoint, window = mistral
    code, result = check(pythons, checkpoint, pythonpath=bridge_2656)
    assert code == 1 and result["verdict"] == "violation"
    _computed(result)
    binding = result["attention_align"]["binding"]
    assert "identity" in binding["failed_tiers"]
    [finding] = [f for f in binding["findings"] if f["code"] == "ATTN_BEHAVIOUR_MISMATCH"]
    assert (
        f"mask: layer 0: from query position {window} on, the training kernel sees {window + 1} tokens, "
        in (finding["message"])
    )
    assert f"the rollout kernel {window} tokens" in finding["message"]
    assert finding["fix"].startswith("the window is off by one")
    assert f"++policy.megatron_cfg.model_overrides.window_size=[{window - 1},0]" in finding["fix"]
    assert {r["field"]: r["status"] for r in binding["fields"]}["rope"] == "match"


def test_with_2656_reintroduced_the_fix_lines_model_override_passes(pythons, mistral, bridge_2656):
    """The override the finding's fix names, applied on the provider as NeMo-RL applies
    ``policy.megatron_cfg.model_overrides``, gives the training side the rollout's window."""
    checkpoint, window = mistral
    override = f"++policy.megatron_cfg.model_overrides.window_size=[{window - 1},0]"
    code, result = check(pythons, checkpoint, override, pythonpath=bridge_2656)
    assert code == 0, result["attention_align"]["binding"]["findings"]
    _computed(result)
    assert result["attention_align"]["training"]["fields"]["mask"]["value"]["kinds"] == [
        {"causal": True, "window": window - 1}
    ]


def test_each_venv_given_for_the_other_side_is_one_line_and_exit_2(pythons, mistral):
    """The two interpreters swapped (lane vllm's venv has no Megatron-Bridge, lane nemo_rl's no vLLM):
    one line naming the flag, the interpreter and what it lacks, no verdict, no traceback."""
    command = [sys.executable, "-m", "nemo_rl_attn_align", "check", str(default_example_path())]
    command += [f"policy.model_name={mistral[0]}", "--training-python", pythons[1], "--rollout-python", pythons[0]]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:]
    assert done.stderr.splitlines() == [
        f"error: --training-python {pythons[1]}: {pythons[1]} has no megatron.bridge: give the interpreter of a venv "
        "with Megatron-Bridge"
    ]
