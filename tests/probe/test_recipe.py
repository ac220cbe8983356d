"""``probe CONFIG [OVERRIDES...]``: both sides read from a NeMo-RL recipe (``probe/recipe.py``),
over the shipped example and every NeMo-RL recipe at the pinned ref, through the CLI's own ``main``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.probe.recipe import TRAINING_ENGINE, recipe_sides
from nemo_rl_attn_align.vocab.errors import UsageError
from tests.golden_outputs import recipe_root

EXAMPLE = default_example_path()


def sides(*overrides: str, checkpoint: str | None = None):
    return recipe_sides(load_config(EXAMPLE, list(overrides)), checkpoint, environ={})


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["probe", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_example_gives_megatron_bridge_training_and_vllm_rollout_with_the_recipes_settings():
    read = sides()
    assert (read.training.engine, read.rollout.engine) == (TRAINING_ENGINE, "vllm")
    assert read.training.model == {
        "checkpoint": "Qwen/Qwen2.5-1.5B",
        "precision": "bfloat16",
        "apply_rope_fusion": True,
        "bias_activation_fusion": True,
        "attention_backend": "flash",
    }
    assert read.rollout.model == {"model": "Qwen/Qwen2.5-1.5B", "dtype": "bfloat16", "max_model_len": 512}


def test_the_preset_is_applied_as_the_run_starts_and_each_change_is_a_note():
    read = sides()
    assert read.rollout.env["VLLM_BATCH_INVARIANT"] == "1"
    assert read.training.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert any(
        note.startswith("preset aligned sets policy.generation.vllm_cfg.env_vars.VLLM_BATCH") for note in read.notes
    )
    plain = sides("attention_align.preset=null")
    assert "VLLM_BATCH_INVARIANT" not in plain.rollout.env and plain.notes == ()


def test_overrides_reach_the_sides_and_the_executor_argument_is_not_taken_over():
    read = sides(
        "attention_align.preset=null",
        "policy.megatron_cfg.apply_rope_fusion=false",
        "++policy.megatron_cfg.model_overrides.rotary_base=5000",
        "++policy.generation.vllm_kwargs.attention_backend=FLEX_ATTENTION",
        "++policy.generation.vllm_kwargs.distributed_executor_backend=ray",
        "policy.generation.vllm_cfg.precision=float32",
        "++policy.generation.vllm_cfg.env_vars.VLLM_X=2",
    )
    assert read.training.model["apply_rope_fusion"] is False
    assert read.training.model["rotary_base"] == 5000
    assert read.rollout.model["attention_backend"] == "FLEX_ATTENTION"
    assert "distributed_executor_backend" not in read.rollout.model
    assert read.rollout.model["dtype"] == "float32"
    assert read.rollout.env == {"VLLM_X": "2"}


def test_parallelism_one_process_cannot_reproduce_is_a_note(tmp_path: Path):
    read = sides(
        "policy.megatron_cfg.tensor_model_parallel_size=2",
        "++policy.megatron_cfg.expert_tensor_parallel_size=4",
        "policy.megatron_cfg.pipeline_model_parallel_size=1",
        checkpoint=str(tmp_path),
    )
    ran_as_one = [note for note in read.notes if note.endswith("runs as 1 here (one process)")]
    assert ran_as_one == [
        "policy.megatron_cfg.tensor_model_parallel_size=2 runs as 1 here (one process)",
        "policy.megatron_cfg.expert_tensor_parallel_size=4 runs as 1 here (one process)",
    ]
    assert read.training.model["checkpoint"] == read.rollout.model["model"] == str(tmp_path.resolve())


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("policy.megatron_cfg.enabled=false", "policy.megatron_cfg.enabled"),
        ("policy.generation.backend=megatron", "policy.generation.backend='megatron'"),
        ("policy.generation=null", "policy.generation.backend"),
        ("policy.model_name=null", "policy.model_name"),
    ],
)
def test_a_recipe_the_probe_cannot_run_is_one_line_naming_the_key(override: str, names: str):
    with pytest.raises(UsageError, match="Fix") as err:
        sides("attention_align.preset=null", override)
    assert names in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "check_reads"),
    [
        ((), "policy.generation.vllm_cfg.precision"),
        (("~policy.generation.vllm_cfg.precision",), "policy.precision"),
        (("~policy.generation.vllm_cfg.precision", "policy.precision=float16"), "policy.precision"),
    ],
)
def test_the_sides_are_what_checks_facts_say_the_run_starts_with(overrides: tuple[str, ...], check_reads: str):
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    cfg = load_config(EXAMPLE, ["attention_align.preset=null", *overrides])
    facts, read = read_recipe_facts(cfg, {}), recipe_sides(cfg, environ={})
    assert facts.generation.precision.key == check_reads
    assert read.rollout.model["dtype"] == facts.generation.precision.value
    assert read.training.model["precision"] == facts.require_policy().precision
    assert read.training.env == facts.require_policy().env_vars and read.rollout.env == facts.generation.env_vars


def test_a_config_without_a_policy_section_says_so():
    with pytest.raises(UsageError, match="the config has no `policy:` section"):
        recipe_sides({"grpo": {}}, environ={})


@pytest.mark.parametrize("after_options", [False, True])
def test_the_cli_prints_the_sides_and_runs_nothing(after_options: bool):
    override = "policy.generation.vllm_cfg.max_model_len=256"
    argv = [str(EXAMPLE), "--sides", override] if after_options else [str(EXAMPLE), override, "--sides"]
    code, out, _ = run(*argv)
    shown = json.loads(out)
    assert code == 0 and set(shown) == {"training", "rollout", "notes"}
    assert shown["rollout"]["model"]["max_model_len"] == 256 and "sequences" not in shown["rollout"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["a.json", "b.json", "c.json"], "3 inputs"),
        (["a.json", "b.json", "--checkpoint", "x"], "--checkpoint applies to a recipe only"),
        (["a.json", "--rollout-python", "python3"], "--rollout-python applies to a recipe only"),
    ],
)
def test_recipe_options_with_side_files_are_one_line_errors(argv: list[str], says: str):
    code, out, err = run(*argv)
    assert code == 2 and out == "" and says in err and err.count("\n") == 1


def test_every_megatron_recipe_of_nemo_rl_gives_two_sides_or_says_why_not():
    root = recipe_root()
    if root is None:
        pytest.skip("ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS is not set (the NeMo-RL snapshots)")
    outcomes = {"sides": 0, "refused": 0}
    for path in sorted(root.glob("*megatron*.yaml")) + sorted((root / "recipes" / "llm").glob("*megatron*.yaml")):
        try:
            read = recipe_sides(load_config(path), environ={})
        except UsageError as err:
            assert "\n" not in str(err) and "Fix" in str(err), path
            outcomes["refused"] += 1
            continue
        assert read.training.model["checkpoint"] == read.rollout.model["model"], path
        assert read.rollout.model["dtype"] in ("bfloat16", "float16", "float32", "auto"), path
        outcomes["sides"] += 1
    assert outcomes["sides"] >= 10, outcomes
