"""``check --gpu``: the kernel each side runs, from the tables generated from TE's and vLLM's own selectors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from nemo_rl_attn_align.kernels import gpu as gpus
from nemo_rl_attn_align.kernels import kernel_table
from nemo_rl_attn_align.kernels.kernel_prediction import NEMO_RL_PINS, predict_rollout, predict_training
from nemo_rl_attn_align.kernels.kernel_query import KernelOptions, RolloutQuery, TrainingQuery
from nemo_rl_attn_align.vocab.errors import UsageError

from .conftest import EXAMPLES, REPO, cli_in_fresh_process

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
    assert {NEMO_RL_PINS["training"], "2.20.2"} <= set(training)
    assert {NEMO_RL_PINS["rollout"], "0.32.0", "0.33.0"} <= set(rollout)
    n_training = len(list(kernel_table.training_queries()))
    assert all(len(t.cells) == n_training for t in training.values()) and n_training == 405504
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
    assert "  all layers (28 of 28): 12 heads / 2 KV, head dim 128, no window:\n" in proc.stdout
    assert "    training: FlashAttention 2.8.3 (Transformer Engine 2.14.1's own selector" in proc.stdout
    # the GRPO example's preset pins vLLM to flash-attn 2 on Hopper (its FA3 is not batch invariant)
    rollout = "FLASH_ATTN FA2" if example == GRPO else "FLASH_ATTN FA3"
    assert f"    rollout: {rollout} (vLLM 0.25.1's own selector" in proc.stdout


def test_sft_example_has_a_training_kernel_and_says_there_is_no_rollout():
    kernels = check_json(SFT, "--gpu", "sm90")["kernels"]
    assert [k["label"] for k in kernels["training"]] == ["FlashAttention 2.8.3"] and kernels["rollout"] == []
    assert kernels["notes"] == ["no rollout kernel: policy.generation.backend is neither vllm nor megatron"]


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
    for version in ("9.9", "not.a.version"):
        result = check_json(GRPO, "--gpu", "sm90", "--te", version)
        assert result["exit_code"] == 2 and result["error"].startswith(
            f"--te '{version}' is no Transformer Engine version the kernel tables know (they know 2.14.1, 2.20.2)"
        )


@pytest.mark.parametrize("flag, version", [("--te", "not.a.version"), ("--vllm", "9.9.9"), ("--vllm", "")])
def test_an_unknown_version_is_one_line_and_exit_2_with_or_without_a_gpu(flag, version):
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", GRPO, flag, version],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{flag} {version!r} is no" in proc.stderr and "(they know " in proc.stderr


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
    assert bad["exit_code"] == 2 and "--gpu 'sm75'" in bad["error"] and "sm103 (B300, GB300)" in bad["error"]


def test_check_with_gpu_imports_no_torch():
    assert cli_in_fresh_process("check", str(GRPO), "--gpu", "sm90")[1] == []


def test_parse_gpu_takes_generations_capabilities_and_product_names():
    assert gpus.parse_gpu("9.0") == gpus.parse_gpu("90") == gpus.parse_gpu("SM90") == gpus.parse_gpu("sm_90a") == "sm90"
    assert gpus.parse_gpu("H100") == gpus.parse_gpu("gh200") == "sm90"
    assert gpus.parse_gpu("B300") == gpus.parse_gpu("GB300") == gpus.parse_gpu("10.3") == "sm103"
    assert gpus.parse_gpu("L40S") == gpus.parse_gpu("l4") == "sm89"
    assert gpus.parse_gpu("A10") == gpus.parse_gpu("A40") == "sm86"
    assert gpus.parse_gpu("rtx pro 6000") == gpus.parse_gpu("RTX-PRO-6000") == "sm120"
    with pytest.raises(UsageError, match=r"--gpu 'sm61'.*sm89 \(L4, L40, L40S, RTX 6000 Ada\)"):
        gpus.parse_gpu("sm61")
    with pytest.raises(UsageError, match="--gpu 'V100'"):
        gpus.parse_gpu("V100")


def test_every_table_file_is_over_this_grid_of_every_generation():
    for side, prefix in kernel_table.PREFIXES.items():
        files = sorted(kernel_table.TABLE_DIR.glob(f"{prefix}-*.json.xz"))
        assert len(files) == len(kernel_table.versions(side)) == len(kernel_table.load(side)) >= 2  # none skipped
        for table in kernel_table.load(side).values():
            assert (
                table.header["versions"][{"training": "transformer-engine", "rollout": "vllm"}[side]] == table.version
            )
    assert kernel_table.table("rollout", "9.9") is None and kernel_table.versions("rollout", REPO) == ()


def test_forceable_is_every_backend_the_tabled_vllm_versions_rank():
    ranked = {name for table in kernel_table.load("rollout").values() for name in table.header["ranked"]}
    assert ranked == set(kernel_table.FORCEABLE)


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
    assert switched.pending and "NVTE_FLASH_ATTN_V2/_V3/_V4 (NVTE_FLASH_ATTN_V3=0)" in switched.pending
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


def test_docs_kernel_table_is_what_the_script_generates():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_kernel_tables", REPO / "scripts" / "update_kernel_tables.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (REPO / "docs" / "kernels.md").read_text(encoding="utf-8")
    assert script.updated_docs(text) == text, "run: python scripts/update_kernel_tables.py docs"
    # the example's preset pins vLLM to flash-attn 2 on Hopper too: every GPU runs FA2 on both sides
    assert "| GRPO example (flash, bf16, packed) | sm80, sm86, sm89, sm90, sm100, sm103, sm110, sm120 |" in text


@pytest.mark.parametrize("gpu", ["sm103", "B300", "GB300", "L40S", "sm89"])
def test_head_dim_256_under_flash_has_no_te_backend_where_te_allows_no_flash_attn_beyond_192(gpu):
    result = check_json(GRPO, "++policy.megatron_cfg.model_overrides.kv_channels=256", "--gpu", gpu)
    assert result["exit_code"] == 1
    (finding,) = [f for f in result["kernels"]["findings"] if f["code"] == "TE_NO_BACKEND"]
    assert "head_dim_qk <= 256 (>192 requires sm80/90/100+)" in finding["message"]
    assert f"on {gpus.parse_gpu(gpu)} Transformer Engine finds no attention backend" in finding["message"]


@pytest.mark.parametrize("gpu", ["sm100", "B200", "H100", "A100", "RTX PRO 6000"])
def test_head_dim_256_under_flash_runs_flash_attn_2_where_te_allows_it(gpu):
    # the override gives training another head dim than the rollout reads: an identity mismatch, which
    # stops a run by default; warn lets the exit code speak of the kernels alone
    warn = "++attention_align.on_mismatch=warn"
    result = check_json(GRPO, "++policy.megatron_cfg.model_overrides.kv_channels=256", warn, "--gpu", gpu)
    assert result["exit_code"] == 0 and result["attention_align"]["binding"]["failed_tiers"][0] == "identity"
    assert [k["label"] for k in result["kernels"]["training"]] == ["FlashAttention 2.8.3"]


@pytest.mark.parametrize("gpu", gpus.GPUS)
def test_every_generation_predicts_both_sides_of_the_grpo_example(gpu):
    kernels = check_json(GRPO, "--gpu", gpu)["kernels"]
    assert kernels["gpu"] == gpu
    for side in ("training", "rollout"):
        (kind,) = kernels[side]
        assert kind["pending"] is None and kind["kernel"], (side, kind)


def test_a_forced_rollout_backend_is_that_backend_validated_by_vllm():
    query = RolloutQuery("sm90", "bf16", 128)
    assert predict_rollout(query).label == "FLASH_ATTN FA3"
    assert predict_rollout(replace(query, forced_backend="TRITON_ATTN")).kernel == "TRITON_ATTN"
    assert predict_rollout(replace(query, forced_backend="FLASHINFER")).kernel == "FLASHINFER"
    sinks = predict_rollout(replace(query, gpu="sm100", has_sink=True, forced_backend="FLASH_ATTN"))
    assert sinks.known and sinks.kernel is None and "FLASH_ATTN: attention sinks not supported" in sinks.reasons
    unknown = predict_rollout(replace(query, forced_backend="NO_SUCH"))
    assert unknown.kernel is None and "NO_SUCH: vLLM 0.25.1 has no such attention backend" in unknown.reasons[0]
    newer = predict_rollout(replace(query, forced_backend="TRITON_FLASH_ATTN"), KernelOptions(vllm="0.25.1"))
    assert newer.kernel is None and "has no such attention backend" in newer.reasons[0]


def test_a_forced_backend_vllm_refuses_stops_check_with_vllm_reason_and_what_runs():
    result = check_json(GRPO, "++policy.generation.vllm_kwargs.attention_backend=flashmla", "--gpu", "sm90")
    assert result["exit_code"] == 1
    (finding,) = [f for f in result["kernels"]["findings"] if f["code"] == "VLLM_NO_BACKEND"]
    assert finding["key"] == "policy.generation.vllm_kwargs.attention_backend" and finding["value"] == "FLASHMLA"
    assert "vLLM refuses the forced backend at engine start" in finding["message"]
    assert "without vllm_kwargs.attention_backend vLLM picks FLASH_ATTN FA3" in finding["fix"]
    assert "TRITON_ATTN" in finding["fix"]


def test_vllm_attention_backend_variable_is_ignored_by_the_tabled_vllm_versions():
    result = check_json(
        GRPO, "++policy.generation.vllm_cfg.env_vars.VLLM_ATTENTION_BACKEND=FLASHINFER", "--gpu", "sm90"
    )
    assert result["kernels"]["rollout"][0]["kernel"] == "FLASH_ATTN"
    (note,) = [n for n in result["kernels"]["notes"] if "VLLM_ATTENTION_BACKEND" in n]
    assert "vLLM reads it before 0.15 only" in note and "vllm_kwargs.attention_backend='FLASHINFER'" in note


def test_another_vllm_version_and_an_unknown_one():
    kernels = check_json(GRPO, "--gpu", "sm90", "--vllm", "0.33.0")["kernels"]
    assert kernels["rollout"][0]["source"].startswith("vLLM 0.33.0's own selector")
    result = check_json(GRPO, "--gpu", "sm90", "--vllm", "9.9")
    assert result["exit_code"] == 2 and "(they know 0.25.1, 0.32.0, 0.33.0, 0.34.0)" in result["error"]


GPT_OSS = ("policy.model_name=openai/gpt-oss-20b", "policy.megatron_cfg.attention_backend=auto")


def test_gpt_oss_on_blackwell_warns_of_the_pair_nemo_rl_documents_and_names_its_fix():
    result = check_json(GRPO, *GPT_OSS, "attention_align.preset=null", "--gpu", "B200")
    assert {kind["kernel"] for kind in result["kernels"]["rollout"]} == {"FLASHINFER"}
    (finding,) = [f for f in result["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]
    assert finding["severity"] == "warning" and result["exit_code"] == 0
    assert "grpo-gptoss-20b-8n4g-megatron.yaml" in finding["message"] and "TRT-LLM" in finding["message"]
    assert finding["fix"] == "set policy.generation.vllm_kwargs.attention_backend=TRITON_ATTN."
    triton = "++policy.generation.vllm_kwargs.attention_backend=TRITON_ATTN"
    fixed = check_json(GRPO, *GPT_OSS, "attention_align.preset=null", triton, "--gpu", "B200")
    assert {kind["kernel"] for kind in fixed["kernels"]["rollout"]} == {"TRITON_ATTN"}
    assert not [f for f in fixed["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]
    hopper = check_json(GRPO, *GPT_OSS, "attention_align.preset=null", "--gpu", "H100")
    assert not [f for f in hopper["kernels"]["findings"] if "TRT-LLM" in f["message"]]


def test_fa3_under_vllm_batch_invariance_on_hopper_is_a_documented_pair():
    invariant = ("attention_align.preset=null", "++policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT=1")
    result = check_json(GRPO, *invariant, "--gpu", "sm90")
    (finding,) = [f for f in result["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]
    assert "#47069" in finding["message"] and "flash_attn_version=2" in finding["fix"] and finding["value"] is None
    pinned = check_json(GRPO, *invariant, f"++{finding['key']}=2", "--gpu", "sm90")
    assert pinned["kernels"]["rollout"][0]["label"] == "FLASH_ATTN FA2"
    assert not [f for f in pinned["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]
    plain = check_json(GRPO, "attention_align.preset=null", "--gpu", "sm90")
    assert plain["kernels"]["rollout"][0]["label"] == "FLASH_ATTN FA3"
    assert not [f for f in plain["kernels"]["findings"] if f["code"] == "KERNEL_PAIR_DOCUMENTED"]


def test_the_binding_preview_takes_the_rollout_backend_vllm_picks_on_that_gpu():
    # under the preset's VLLM_BATCH_INVARIANT=1 vLLM drops FLASHINFER on sm100; gpt-oss's sinks rule out FLASH_ATTN
    result = check_json(GRPO, *GPT_OSS, "--gpu", "B200")
    rollout = result["attention_align"]["rollout"]["fields"]
    assert rollout["backend"]["value"] == "TRITON_ATTN" and rollout["backend"]["provenance"] == "configured"
    assert rollout["reduction_order"]["provenance"] == "pending"
    assumed = check_json(GRPO, *GPT_OSS)["attention_align"]["rollout"]["fields"]  # no GPU: FLASH_ATTN assumed
    assert assumed["backend"]["provenance"] == "pending" and assumed["reduction_order"]["value"] == "kv_index"
