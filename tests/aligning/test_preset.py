"""``attention_align.preset: aligned`` and ``check --fix``: from finding mismatches to removing them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from nemo_rl_attn_align.aligning.fix import minimal
from nemo_rl_attn_align.aligning.preset import align, blocking_causes, set_key
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.config.settings import load_settings
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from tests.conftest import EXAMPLES, REPO

#: The stock recipe (no preset): the shipped mismatch example.
GRPO = str(EXAMPLES / "grpo_math_1B_megatron_flash_mismatch.yaml")
ALIGNED = str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
BI = "policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT"
CUBLAS = "policy.megatron_cfg.env_vars.CUBLAS_WORKSPACE_CONFIG"


def check(*args):
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def aligned(*overrides, alter_ok=False, environ=None):
    """The config, its alignment, and the reader and previewer ``align`` was given (as ``check``'s)."""
    from nemo_rl_attn_align.binding.binding_preview import preview_binding

    cfg = load_config(GRPO, list(overrides))
    settings = load_settings(cfg)
    environ = {} if environ is None else environ

    def read(c):
        return read_recipe_facts(c, environ)

    def preview(facts):
        return preview_binding(facts, settings, environ)

    return cfg, align(cfg, read, preview, alter_ok=alter_ok), (read, preview)


def test_stock_grpo_is_aligned_by_two_environment_variables():
    cfg, result, _ = aligned()
    assert [(c.key, c.value) for c in result.changes] == [(BI, "1"), (CUBLAS, ":4096:8")]
    assert result.aligned and not blocking_causes(result.preview)
    assert cfg["policy"]["generation"]["vllm_cfg"].get("env_vars") is None  # the input is left as it was


def test_a_chosen_rollout_precision_is_refused_by_the_preset_and_fixed_by_fix():
    _, result, _ = aligned("++policy.generation.vllm_cfg.precision=float16")
    assert result.refusal.key == "policy.generation.vllm_cfg.precision"
    _, fixed, _ = aligned("++policy.generation.vllm_cfg.precision=float16", alter_ok=True)
    assert ("policy.generation.vllm_cfg.precision", "bfloat16", True) in [
        (c.key, c.value, c.alters_run) for c in fixed.changes
    ]
    assert fixed.aligned


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["policy.megatron_cfg.context_parallel_size=2"], "policy.megatron_cfg.context_parallel_size"),
        (
            ["policy.megatron_cfg.tensor_model_parallel_size=2", "policy.generation.vllm_cfg.tensor_parallel_size=2"],
            "policy.megatron_cfg.tensor_model_parallel_size",
        ),
    ],
)
def test_the_preset_keeps_the_layout_and_refuses_with_one_finding(overrides, key):
    _, result, _ = aligned(*overrides)
    assert not result.aligned
    assert result.refusal.code == "ALIGN_PRESET_REFUSED" and result.refusal.key == key
    assert all(not c.alters_run for c in result.changes)
    assert (BI, "1") in [(c.key, c.value) for c in result.changes]  # what can be aligned still is


def test_fix_may_change_the_layout_and_is_minimal():
    cfg, result, (read, preview) = aligned(
        "policy.megatron_cfg.context_parallel_size=2",
        "++policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT='1'",
        alter_ok=True,
    )
    assert result.aligned
    keys = [c.key for c in minimal(cfg, result, read, preview)]
    assert keys == ["policy.megatron_cfg.context_parallel_size", CUBLAS]  # BI is already set


def test_fix_checks_the_rules_in_the_environment_it_was_given(monkeypatch):
    from nemo_rl_attn_align.aligning import fix

    environ = {"NVTE_FLASH_ATTN": "0"}
    cfg, result, (read, preview) = aligned(
        "policy.megatron_cfg.context_parallel_size=2", alter_ok=True, environ=environ
    )
    seen = []
    real = fix.build_plan
    monkeypatch.setattr(fix, "build_plan", lambda facts: seen.append(facts.policy.nvte_env) or real(facts))
    minimal(cfg, result, read, preview)
    assert seen and all(nvte["NVTE_FLASH_ATTN"] == ("0", "environment NVTE_FLASH_ATTN") for nvte in seen)


@pytest.mark.parametrize("extra", [[], ["policy.megatron_cfg.context_parallel_size=2"]])
def test_fix_pasted_back_passes_with_on_mismatch_error(extra):
    args = [GRPO, *extra, "++attention_align.on_mismatch=error"]
    first = check(*args, "--fix", "--json")
    assert first.returncode == 1  # the stock recipe would stop at start under on_mismatch: error
    overrides = json.loads(first.stdout)["fix"]["overrides"]
    assert overrides
    pasted = shlex.split(" ".join(overrides))  # as a shell would split the printed line
    second = check(*args, *pasted)
    assert second.returncode == 0, second.stdout
    assert second.stdout.splitlines()[-1].startswith("verdict: OK to launch; the preview finds no mismatch")


def test_fix_on_an_aligned_recipe_needs_nothing():
    proc = check(GRPO, "++attention_align.preset=aligned", "--fix")
    assert proc.returncode == 0
    assert "preset aligned: 2 change(s)" in proc.stdout and "fix: none needed" in proc.stdout


def test_check_with_the_preset_passes_under_on_mismatch_error():
    proc = check(GRPO, "++attention_align.preset=aligned", "++attention_align.on_mismatch=error")
    assert proc.returncode == 0, proc.stdout
    assert f"{BI}='1'" in proc.stdout


def test_the_shipped_grpo_example_is_aligned_as_it_stands():
    proc = check(ALIGNED, "++attention_align.on_mismatch=error", "--fix")
    assert proc.returncode == 0, proc.stdout
    assert "preset aligned: 2 change(s)" in proc.stdout and "fix: none needed" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("verdict: OK to launch; the preview finds no mismatch")


def test_failed_binding_under_warn_is_labelled_a_warning():
    proc = check(GRPO)
    failing = [line for line in proc.stdout.splitlines() if "ATTN_SEMANTIC_MANDATE" in line]
    assert failing and all(line.lstrip().startswith("warning ") for line in failing)
    assert not any(line.lstrip().startswith("error ") for line in proc.stdout.splitlines())


def test_unknown_preset_is_one_line_exit_2():
    proc = check(GRPO, "++attention_align.preset=align")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "did you mean 'aligned'" in proc.stderr


def test_set_key_creates_null_sections_and_reaches_pydantic_attributes():
    from pydantic import BaseModel, ConfigDict

    class Master(BaseModel):
        model_config = ConfigDict(extra="allow")

    master = Master(policy={"megatron_cfg": {"env_vars": None}})
    set_key(master, CUBLAS, ":4096:8")
    assert master.policy["megatron_cfg"]["env_vars"] == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    with pytest.raises(ValueError, match=re.escape("policy.megatron_cfg")):
        set_key({"policy": {"megatron_cfg": "oops"}}, CUBLAS, "x")


@pytest.mark.parametrize("value", ["5", "'NVTE_FLASH_ATTN=1'", "[a]"])
def test_a_parent_that_is_not_a_mapping_is_refused_not_a_traceback(value):
    _, result, _ = aligned(f"policy.megatron_cfg.env_vars={value}")
    assert not result.aligned and result.refusal.key == "policy.megatron_cfg.env_vars"
    assert "is not a mapping" in result.refusal.message
    proc = check(GRPO, "++attention_align.preset=aligned", f"policy.megatron_cfg.env_vars={value}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout


def test_fused_rope_in_training_is_named_never_applied_and_gone_once_unfused():
    """NeMo-RL's default fused RoPE in training against vLLM's own RoPE: the preset and ``--fix``
    name ``apply_rope_fusion: false`` (recorded tier: nothing fails over it), the preset never applies
    it, and with it set nothing is recommended."""
    _, result, _ = aligned()
    (change,) = result.recommended
    assert (change.key, change.value, change.alters_run) == ("policy.megatron_cfg.apply_rope_fusion", False, True)
    assert "#1801" in change.reason and change not in result.changes
    assert result.to_dict()["recommended"] == [change.to_dict()]
    _, unfused, _ = aligned("++policy.megatron_cfg.apply_rope_fusion=false")
    assert unfused.recommended == ()
    proc = check(GRPO, "--fix")
    assert "fix: also recommended: '++policy.megatron_cfg.apply_rope_fusion=false'" in proc.stdout
    assert "'++policy.megatron_cfg.apply_rope_fusion=false'" not in proc.stdout.split("fix: also recommended")[0]


def test_no_fusion_advice_where_rope_itself_differs():
    """Where the two sides' RoPE differ beyond the fusion, turning the fusion off is not the fix."""
    import dataclasses

    from nemo_rl_attn_align.aligning.preset import recommended
    from nemo_rl_attn_align.binding.binding import Status

    _, result, _ = aligned()
    binding = result.preview.binding
    assert binding.result("rope_type").status is not Status.MISMATCH and recommended(result.preview)
    results = tuple(
        dataclasses.replace(r, status=Status.MISMATCH) if r.name == "rope_type" else r for r in binding.results
    )
    broken = result.preview._replace(binding=dataclasses.replace(binding, results=results))
    assert recommended(broken) == ()
