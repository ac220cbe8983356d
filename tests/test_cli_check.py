"""``nemo-rl-attn-align check`` as a user runs it: a real subprocess per case."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import EXAMPLES, REPO

GRPO = str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
#: The same recipe without the preset: its preview fails on reduction_order.
MISMATCH = str(EXAMPLES / "grpo_math_1B_megatron_flash_mismatch.yaml")


def check(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_example_passes_and_shows_flash_mapping():
    proc = check(GRPO)
    assert proc.returncode == 0, proc.stderr
    assert "flash" in proc.stdout and "AttnBackend.flash" in proc.stdout
    assert "NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0 NVTE_UNFUSED_ATTN=0" in proc.stdout


def test_sft_example_passes():
    assert check(str(EXAMPLES / "sft_megatron_flash.yaml")).returncode == 0


def test_float32_override_fails_naming_precision():
    proc = check(GRPO, "policy.precision=float32")
    assert proc.returncode == 1
    assert "FLASH_REQUIRES_HALF_PRECISION" in proc.stdout and "policy.precision" in proc.stdout
    assert "bfloat16" in proc.stdout


def test_wrong_case_backend_lists_valid_names():
    proc = check(GRPO, "++policy.megatron_cfg.attention_backend=Flash")
    assert proc.returncode == 1
    assert "flash, fused, unfused, local, auto" in proc.stdout and "did you mean 'flash'" in proc.stdout


def test_missing_file_exits_2_with_one_line():
    proc = check("no/such/config.yaml")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "does not exist" in proc.stderr


def test_override_of_missing_key_without_plus_plus_exits_2():
    proc = check(GRPO, "policy.megatron_cfg.not_a_key=1")
    assert proc.returncode == 2 and "++policy.megatron_cfg.not_a_key" in proc.stderr


def test_no_config_checks_the_packaged_example():
    proc = check()
    assert proc.returncode == 0 and "grpo_math_1B_megatron_flash.yaml" in proc.stdout


def test_overrides_alone_apply_to_the_packaged_example():
    proc = check("policy.precision=float32")
    assert proc.returncode == 1 and "grpo_math_1B_megatron_flash.yaml" in proc.stdout


@pytest.mark.parametrize("args, code", [((GRPO,), 0), ((GRPO, "policy.precision=float32"), 1), (("missing.yaml",), 2)])
def test_json_is_one_object_with_the_exit_code(args, code):
    proc = check("--json", *args)
    assert proc.returncode == code
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == code
    if code != 2:
        assert doc["plan"]["attn_backend"] == "AttnBackend.flash"
        assert doc["verdict"] == ("ok" if code == 0 else "violation")


def test_environment_nvte_conflict_is_reported(monkeypatch):
    import os

    env = dict(os.environ, NVTE_FLASH_ATTN="0")
    proc = check(GRPO, "~policy.megatron_cfg.attention_backend", env=env)
    assert proc.returncode == 1 and "NVTE_ENV_CONFLICT" in proc.stdout


def test_check_imports_neither_torch_nor_megatron_nor_the_other_commands():
    code = (
        "import sys; from nemo_rl_attn_align.cli import main; before = set(sys.modules); "
        "rc = main(['check', '--json']);"
        "heavy = sorted(m for m in ('torch', 'megatron', 'megatron.core', 'vllm', 'ray', 'transformer_engine',"
        " 'nemo_rl_attn_align.cli.drift', 'nemo_rl_attn_align.cli.report') if m in set(sys.modules) - before);"
        "print('HEAVY', heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_help_still_lists_every_command():
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0
    assert all(name in proc.stdout for name in ("check", "report", "drift", "run", "examples"))


def test_bad_flag_is_a_usage_error():
    proc = check("--no-such-flag")
    assert proc.returncode == 2


def test_binding_preview_is_shown_and_only_warns_by_default():
    proc = check(MISMATCH)
    assert proc.returncode == 0
    assert "binding preview" in proc.stdout and "reduction_order" in proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        "verdict: OK to launch; the preview finds 1 semantic mismatch (reduction_order): the run warns and goes on "
        "(on_mismatch semantic: warn)"
    )


def test_failing_preview_with_on_mismatch_error_exits_1():
    proc = check(MISMATCH, "++attention_align.on_mismatch=error")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == (
        "verdict: FAIL, not ready to launch: the preview finds 1 semantic mismatch (reduction_order): "
        "the run stops at start (on_mismatch semantic: error)"
    )


def test_aligned_rollout_is_not_a_failure_even_with_on_mismatch_error():
    proc = check(
        MISMATCH,
        "++attention_align.on_mismatch=error",
        "++policy.generation.vllm_cfg.env_vars={VLLM_BATCH_INVARIANT:'1'}",
        "++policy.megatron_cfg.env_vars={CUBLAS_WORKSPACE_CONFIG:':4096:8'}",
    )
    assert proc.returncode == 0, proc.stdout
    assert "binding preview ('pending' = known once the engines run): pass" in proc.stdout


def test_bad_attention_align_block_is_unusable_input():
    proc = check(GRPO, "++attention_align.on_mismatch=eror")
    assert proc.returncode == 2
    assert "attention_align.on_mismatch" in proc.stderr and "did you mean 'error'" in proc.stderr


def test_full_lists_every_field():
    proc = check("--full", GRPO)
    assert proc.returncode == 0
    for field in ("architecture", "merge_rule", "kv_page_size", "versions"):
        assert field in proc.stdout


def test_sft_has_no_binding_to_preview():
    proc = check(str(EXAMPLES / "sft_megatron_flash.yaml"))
    assert "binding preview: not applicable" in proc.stdout


def test_json_carries_the_preview_and_settings():
    doc = json.loads(check("--json", MISMATCH).stdout)
    align = doc["attention_align"]
    assert align["settings"]["on_mismatch"] == {"identity": "error", "semantic": "warn"}
    assert align["binding"]["failed_tiers"] == ["semantic"]
    assert align["verdict"] == "fail" and align["training"]["side"] == "training"


@pytest.mark.parametrize("command", ["check", "drift"])
def test_overrides_are_taken_after_options_too(command):
    """``CONFIG --option OVERRIDE``: the override reaches the config (a missing key is its usage error)."""
    args = [GRPO, "--json", "policy.megatron_cfg.not_a_key=1"] + (["--no-plot"] if command == "drift" else [])
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", command, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2 and "++policy.megatron_cfg.not_a_key" in proc.stderr, proc.stderr
    after = check(GRPO, "--json", "policy.precision=float32")
    assert after.returncode == 1 and json.loads(after.stdout)["overrides"] == ["policy.precision=float32"]
    assert check(GRPO, "--json", "--no-such-flag").returncode == 2
