"""``check --gpu``: the kernel each side runs, from the tables generated from TE's and vLLM's own selectors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nemo_rl_attn_align.errors import UsageError
from nemo_rl_attn_align.preflight import gpu as gpus
from nemo_rl_attn_align.preflight import kernel_table
from nemo_rl_attn_align.preflight.kernel_query import RolloutQuery, TrainingQuery
from nemo_rl_attn_align.preflight.kernels import NEMO_RL_TE, predict_rollout, predict_training

from .conftest import EXAMPLES, REPO

GRPO = str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
MISMATCH = str(EXAMPLES / "grpo_math_1B_megatron_flash_mismatch.yaml")
SFT = str(EXAMPLES / "sft_megatron_flash.yaml")


def check_json(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    result = json.loads(proc.stdout)
    assert result["exit_code"] == proc.returncode, proc.stderr
    return result


def test_tables_cover_their_grids_at_the_versions_they_name():
    training, rollout = kernel_table.load("training"), kernel_table.load("rollout")
    assert {NEMO_RL_TE, "2.20.2"} <= set(training) and "0.32.0" in rollout
    n_training = len(list(kernel_table.training_queries()))
    assert all(len(t.cells) == n_training for t in training.values()) and n_training == 38016
    assert all(len(t.cells) == len(list(kernel_table.rollout_queries())) for t in rollout.values())
    kernels = {t.results[c][0] for t in training.values() for c in t.cells}
    assert kernels == {"FlashAttention", "FusedAttention", "UnfusedDotProductAttention", None}


@pytest.mark.parametrize("example", [GRPO, MISMATCH])
def test_gpu_sm90_prints_both_kernels_of_the_grpo_examples(example):
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", example, "--gpu", "sm90"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert "kernels on sm90 (--gpu):" in proc.stdout
    assert "  training, all layers (28 of 28): 12 heads / 2 KV, head dim 128, no window:\n" in proc.stdout
    assert "    FlashAttention 2.8.3 (Transformer Engine 2.14.1's own selector" in proc.stdout
    assert "    FLASH_ATTN FA3 (vLLM 0.32.0's own selector" in proc.stdout


def test_sft_example_has_a_training_kernel_and_says_there_is_no_rollout():
    kernels = check_json(SFT, "--gpu", "sm90")["kernels"]
    assert [k["label"] for k in kernels["training"]] == ["FlashAttention 2.8.3"] and kernels["rollout"] == []
    assert kernels["notes"] == ["no rollout kernel: policy.generation.backend is not vllm"]


#: Recipes TE leaves without a backend on some GPU: (overrides, GPU, TE's words that must be quoted).
NO_BACKEND = [
    (["policy.precision=float32"], "sm90", "Disabling FlashAttention 2 for unsupported qkv_dtype = torch.float32"),
    (["policy.megatron_cfg.attention_backend=fused", "policy.precision=float32"], "sm80",
     "Disabling FusedAttention for unsupported qkv_dtype = torch.float32"),
    (["++policy.megatron_cfg.model_overrides.softmax_type=learnable"], "sm90",
     "Disabling FlashAttention for softmax_type = learnable"),
    (["++policy.megatron_cfg.model_overrides.softmax_type=off-by-one"], "sm100",
     "Disabling FlashAttention for softmax_type = off-by-one"),
    (["policy.megatron_cfg.attention_backend=unfused", "policy.megatron_cfg.context_parallel_size=2"], "sm90",
     "Disabling UnfusedDotProductAttention as it does not support context parallelism"),
    (["policy.megatron_cfg.attention_backend=auto", "policy.precision=float32",
      "policy.megatron_cfg.context_parallel_size=2"], "sm100",
     "Disabling UnfusedDotProductAttention as it does not support context parallelism"),
    # no rule of ours knows these two: cuDNN's packed (thd) attention on Ampere, hd256 deterministic on Blackwell
    (["policy.megatron_cfg.attention_backend=fused"], "sm80",
     "Disabling FusedAttention as no backend supports the provided input"),
    (["policy.megatron_cfg.attention_backend=fused", "++policy.megatron_cfg.model_overrides.kv_channels=256",
      "++policy.megatron_cfg.env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO=0", "policy.sequence_packing.enabled=false"],
     "sm100", "Disabling FusedAttention as no backend supports the provided input"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "gpu", "reason"), NO_BACKEND)
def test_recipe_without_a_te_backend_stops_with_te_reason_and_a_fix(overrides, gpu, reason):
    result = check_json(GRPO, *overrides, "--gpu", gpu)
    assert result["exit_code"] == 1
    kernels = result["kernels"]
    (training,) = kernels["training"]
    assert training["kernel"] is None and training["pending"] is None
    (finding,) = [f for f in kernels["findings"] if f["code"] == "TE_NO_BACKEND"]
    assert finding["severity"] == "error" and finding["key"] == "policy.megatron_cfg.attention_backend"
    assert (
        reason in finding["message"] and f"on {gpu} Transformer Engine finds no attention backend" in finding["message"]
    )
    assert finding["fix"] and f"for {training['layers']}" in finding["message"]
    if training["belief"]:
        assert "our stand-in for TE's C++ check, not TE" in finding["message"]


def test_fix_names_the_backends_that_run_there():
    result = check_json(GRPO, "policy.megatron_cfg.attention_backend=fused", "--gpu", "sm80")
    (finding,) = result["kernels"]["findings"]
    assert "attention_backend=flash runs FlashAttention 2.8.3" in finding["fix"]


def test_another_te_version_and_an_unknown_one():
    kernels = check_json(GRPO, "--gpu", "sm90", "--te", "2.20.2")["kernels"]
    assert kernels["training"][0]["source"].startswith("Transformer Engine 2.20.2's own selector")
    kernels = check_json(GRPO, "--gpu", "sm90", "--te", "9.9")["kernels"]
    assert kernels["training"][0]["pending"] == "no Transformer Engine table (--te 9.9 has no table)"
    assert check_json(GRPO, "--gpu", "sm90", "--te", "9.9")["exit_code"] == 0


def test_without_a_gpu_the_kernels_are_pending_and_a_bad_gpu_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", GRPO],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/nonexistent", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0 and "kernels: pending (no GPU on this machine (no nvidia-smi)" in proc.stdout
    bad = check_json(GRPO, "--gpu", "sm75")
    assert bad["exit_code"] == 2 and "--gpu 'sm75'" in bad["error"] and "sm80, sm90, sm100" in bad["error"]


def test_check_with_gpu_imports_no_torch():
    code = (
        "import sys\n"
        "from nemo_rl_attn_align.cli import main\n"
        f"main(['check', {GRPO!r}, '--gpu', 'sm90'])\n"
        "bad = sorted(m for m in ('torch', 'transformer_engine', 'vllm', 'megatron') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_parse_gpu():
    assert gpus.parse_gpu("9.0") == gpus.parse_gpu("90") == gpus.parse_gpu("SM90") == "sm90"
    with pytest.raises(UsageError, match="sm80, sm90, sm100"):
        gpus.parse_gpu("sm61")


def test_local_gpu_reads_one_generation(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def smi(stdout, returncode=0):
        return lambda *a, **k: subprocess.CompletedProcess(a, returncode, stdout, "")

    assert gpus.local_gpu(smi("9.0\n9.0\n")) == ("sm90", "this machine's GPU (nvidia-smi)")
    assert gpus.local_gpu(smi("8.0\n9.0\n"))[0] is None
    assert "no kernel table" in gpus.local_gpu(smi("7.5\n"))[1]
    assert gpus.local_gpu(smi("", 9))[0] is None


def test_head_dims_are_answered_by_their_class_and_a_pair_without_one_is_pending():
    odd = predict_training(TrainingQuery("sm90", "flash", "bf16", 16, 8, 72, 72))
    assert odd.known and "head dims 72/72 as 96/96 (TE's rules do not tell them apart)" in odd.assumptions
    big = predict_training(TrainingQuery("sm90", "flash", "bf16", 16, 8, 512, 512))
    assert big.known and big.kernel is None  # TE's rules: no flash-attn beyond 256
    unpaired = predict_training(TrainingQuery("sm90", "flash", "bf16", 16, 8, 192, 64))
    assert unpaired.pending and "no class of the generated table holds this pair" in unpaired.pending
    switched = predict_training(
        TrainingQuery("sm90", "flash", "bf16", 16, 8, 128, 128, flash_switches=(("NVTE_FLASH_ATTN_V3", "0"),))
    )
    assert switched.pending and "NVTE_FLASH_ATTN_V2/_V3/_V4" in switched.pending
    forced = predict_rollout(RolloutQuery("sm90", "bf16", 128, forced_backend="FLASHINFER"))
    assert forced.pending and "forces the backend" in forced.pending
    window = predict_training(TrainingQuery("sm90", "flash", "bf16", 16, 8, 128, 128, window=4096))
    assert window.known and "any sliding window as a left window of 1023" in window.assumptions


@pytest.mark.parametrize(
    ("qk", "v", "cell"),
    [(8, 8, "64/64"), (64, 64, "64/64"), (72, 72, "96/96"), (120, 120, "128/128"), (160, 160, "192/192"),
     (248, 248, "224/224"), (256, 256, "256/256"), (264, 264, "384/384"), (512, 512, "512/512"),
     (576, 576, "384/384"), (100, 100, "100/100"), (260, 260, "300/300"), (192, 128, "192/128"),
     (136, 104, "192/128"), (192, 64, None), (128, 192, None)],
)  # fmt: skip
def test_head_dim_classes(qk, v, cell):
    assert kernel_table.training_head_dims(qk, v) == cell


def test_readme_kernel_table_is_what_the_script_generates():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_kernel_tables", REPO / "scripts" / "update_kernel_tables.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert script.updated_readme(text) == text, "run: python scripts/update_kernel_tables.py readme"
    assert "| GRPO example (flash, bf16, packed) | FlashAttention 2.8.3 / FLASH_ATTN FA2 |" in text
