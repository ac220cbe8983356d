"""The preset's and ``check --fix``'s kernel step: one flash-attn generation on both sides, per GPU, from the tables."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.config.settings import load_settings
from nemo_rl_attn_align.hosts import nemo_rl_driver
from nemo_rl_attn_align.kernels import kernel_prediction as kernels
from nemo_rl_attn_align.kernels.kernel_choice import choose
from nemo_rl_attn_align.kernels.kernel_pairs import flash_generation
from nemo_rl_attn_align.kernels.kernel_prediction import (
    megatron_flash_kernel,
    predict_rollout,
    predict_training,
)
from nemo_rl_attn_align.kernels.kernel_query import (
    Kernel,
    KernelOptions,
    KernelPlan,
    KindKernel,
    RolloutQuery,
    TrainingQuery,
    flash_pin_switches,
)
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from tests.test_cli_check_gpu import GPT_OSS, GRPO, check_json

PIN = "policy.generation.vllm_kwargs.attention_config.flash_attn_version"


def changes(section: dict) -> dict:
    return {c["key"]: c["value"] for c in section["changes"]}


def documented(result: dict) -> list[dict]:
    return [f for f in result["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]


def test_flash_generation_reads_each_hosts_label():
    assert flash_generation(Kernel("training", "FlashAttention", "2.8.3")) == 2
    assert flash_generation(Kernel("training", "FlashAttention", "3.0.0b1")) == 3
    assert flash_generation(Kernel("rollout", "FLASH_ATTN", "FA3")) == 3
    assert flash_generation(Kernel("rollout", "flash_attn", "FA2")) == 2
    assert flash_generation(Kernel("training", "FusedAttention", "1")) is None
    assert flash_generation(Kernel("rollout", "FLASH_ATTN", "FA?")) is None


def test_the_pins_reach_both_selectors_tables():
    hopper = TrainingQuery("sm90", "flash", "bf16", 16, 8, 128, 128, flash_attn_3=True)
    assert predict_training(hopper, KernelOptions(te="2.20.2")).label == "FlashAttention 3.0.0b1"
    pinned = TrainingQuery(**{**hopper.__dict__, "flash_switches": flash_pin_switches(2)})
    assert pinned.flash_pin == 2
    assert predict_training(pinned, KernelOptions(te="2.20.2")).label == "FlashAttention 2.8.3"
    assert predict_training(pinned, KernelOptions(te="2.14.1")).label == "FlashAttention 3.0.0b1"  # no V* switches
    mixed = TrainingQuery(**{**hopper.__dict__, "flash_switches": (("NVTE_FLASH_ATTN_V4", "0"),)})
    assert "more than one flash-attn generation" in str(predict_training(mixed).pending)
    rollout = RolloutQuery("sm90", "bf16", 128, batch_invariant=True)
    assert predict_rollout(rollout).label == "FLASH_ATTN FA3"
    assert predict_rollout(RolloutQuery("sm90", "bf16", 128, batch_invariant=True, flash_attn_version=2)).label == (
        "FLASH_ATTN FA2"
    )
    refused = predict_rollout(RolloutQuery("sm80", "bf16", 128, flash_attn_version=3))
    assert refused.kernel is None and any("flash-attn 3 does not run here" in r for r in refused.reasons)


def test_the_preset_on_hopper_pins_vllm_to_the_flash_attn_training_runs():
    result = check_json(GRPO, "--gpu", "H100")  # the example's preset sets VLLM_BATCH_INVARIANT=1
    preset = result["attention_align"]["preset"]
    assert changes(preset)[PIN] == 2
    assert preset["kernels"]["one_generation"] is True
    assert (preset["kernels"]["training"], preset["kernels"]["rollout"]) == ("FlashAttention 2.8.3", "FLASH_ATTN FA2")
    assert result["kernels"]["rollout"][0]["label"] == "FLASH_ATTN FA2" and not documented(result)


def test_on_ampere_the_pair_is_already_one_generation():
    preset = check_json(GRPO, "--gpu", "A100")["attention_align"]["preset"]
    assert PIN not in changes(preset) and preset["kernels"]["one_generation"] is True


def test_flash_attn_3_on_hopper_pins_both_sides_to_2_where_te_has_the_switches():
    result = check_json(GRPO, "--gpu", "sm90", "--fa3", "--te", "2.20.2")
    preset = result["attention_align"]["preset"]
    assert changes(preset)["policy.megatron_cfg.env_vars.NVTE_FLASH_ATTN_V3"] == "0"
    assert changes(preset)[PIN] == 2 and preset["kernels"]["one_generation"] is True
    assert result["kernels"]["training"][0]["label"] == "FlashAttention 2.8.3"
    # TE 2.14.1 (NeMo-RL main's pin) has no NVTE_FLASH_ATTN_V* switch: FA3 trains, and vLLM's FA3 is not invariant
    old = check_json(GRPO, "--gpu", "sm90", "--fa3")
    kernels = old["attention_align"]["preset"]["kernels"]
    assert kernels["one_generation"] is False and kernels["finding"]["code"] == "KERNEL_PAIR_SPLIT"
    assert "FlashAttention 3.0.0b1" in kernels["finding"]["message"] and not documented(old)
    assert any(f["code"] == "KERNEL_PAIR_SPLIT" for f in old["kernels"]["findings"]) and old["exit_code"] == 0


def test_sinks_on_blackwell_have_no_flash_pair_and_the_preset_says_so():
    result = check_json(GRPO, *GPT_OSS, "--gpu", "B200")
    kernels = result["attention_align"]["preset"]["kernels"]
    assert kernels["rollout"] == "TRITON_ATTN" and kernels["training"].startswith("FusedAttention")
    assert kernels["one_generation"] is False and "on sm100 no setting makes" in kernels["finding"]["message"]


def test_fix_changes_the_training_kernel_where_the_preset_may_not():
    result = check_json(GRPO, "policy.megatron_cfg.attention_backend=fused", "--gpu", "H100", "--fix")
    assert result["attention_align"]["preset"]["kernels"]["one_generation"] is False  # the preset keeps fused
    fix = result["fix"]
    assert changes(fix)["policy.megatron_cfg.attention_backend"] == "flash" and fix["kernels"]["one_generation"]
    assert "'++policy.megatron_cfg.attention_backend=\"flash\"'" in fix["overrides"]


def test_fix_without_the_preset_adds_the_pin_after_batch_invariance():
    fix = check_json(GRPO, "attention_align.preset=null", "--gpu", "H100", "--fix")["fix"]
    keys = changes(fix)
    assert keys["policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT"] == "1" and keys[PIN] == 2
    assert f"'++{PIN}=2'" in fix["overrides"]


def test_without_a_gpu_nothing_is_chosen():
    preset = check_json(GRPO)["attention_align"]["preset"]
    assert preset["kernels"] is None and PIN not in changes(preset)


def _megatron_plan(gpu: str, backend: str, pinned: int | None, options: KernelOptions) -> KernelPlan:
    training = TrainingQuery(gpu, backend, "bf16", 16, 8, 128, 128, flash_attn_3=options.flash_attn_3)
    kind = KindKernel("all layers", predict_training(training, options), training, 2)
    rollout = KindKernel("all layers", megatron_flash_kernel(pinned, options))
    return KernelPlan(gpu, "--gpu", (kind,), (rollout,))


def test_megatron_generation_is_pinned_by_fix_only_to_a_flash_attn_that_runs_there():
    fa3 = KernelOptions(flash_attn_3=True)
    pinned_to_2 = _megatron_plan("sm90", "flash", 2, fa3)  # TE runs FA3 (installed); generation pinned to FA2
    preset = choose(pinned_to_2, fa3)
    assert preset is not None and not preset.one_generation and preset.changes == ()
    fix = choose(pinned_to_2, fa3, alter_ok=True)
    assert fix is not None and fix.one_generation
    assert [(c.key, c.value) for c in fix.changes] == [
        ("policy.megatron_cfg.model_overrides.flash_attention_version", 3)
    ]
    ampere = choose(_megatron_plan("sm80", "fused", None, fa3), fa3, alter_ok=True)  # no FA3 off Hopper
    assert (
        ampere is not None
        and ampere.one_generation
        and (ampere.training, ampere.rollout)
        == (
            "FlashAttention 2.8.3",
            "flash_attn FA2",
        )
    )
    invariant = choose(_megatron_plan("sm80", "flash", 3, fa3), fa3, alter_ok=True, invariant_mode=True)
    assert invariant is not None and not invariant.one_generation  # batch-invariant mode forbids 2; no FA3 on sm80
    assert choose(KernelPlan(None, "no GPU")) is None


def _driver_preset(monkeypatch, installed_vllm: str | None) -> tuple[dict, dict]:
    """The driver's preset on the shipped GRPO example: (the master config after it, the preset's record)."""
    monkeypatch.setattr(kernels, "_installed", lambda distribution: installed_vllm if distribution == "vllm" else None)
    cfg = load_config(Path(GRPO), [])
    return cfg, nemo_rl_driver.apply_preset(cfg, read_recipe_facts(cfg), load_settings(cfg))[0]


def _vllm_kwargs(cfg: dict) -> dict:
    return cfg["policy"]["generation"].get("vllm_kwargs") or {}


@pytest.mark.parametrize("gpu, pinned", [("8.0", False), ("9.0", True)])
def test_the_driver_preset_chooses_on_its_nodes_gpu_for_the_installed_vllm(tmp_path, monkeypatch, caplog, gpu, pinned):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho {gpu}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cfg, preset = _driver_preset(monkeypatch, "0.25.1")
    assert (_vllm_kwargs(cfg).get("attention_config") == {"flash_attn_version": 2}) is pinned
    assert preset["kernels"]["one_generation"] is True
    with caplog.at_level(logging.WARNING, "nemo_rl_attn_align"):
        cfg, preset = _driver_preset(monkeypatch, None)
    assert preset["kernels"] is None and "attention_config" not in _vllm_kwargs(cfg)
    assert "chooses no kernels: the driver's environment has no vLLM" in caplog.text
