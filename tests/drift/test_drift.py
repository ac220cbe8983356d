"""The drift sweep: shape resolution, the CLI's JSON/table/PNG output and its usage errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.cli import main  # noqa: E402
from nemo_rl_attn_align.drift import shape as drift_shape  # noqa: E402
from nemo_rl_attn_align.drift import sweep as drift  # noqa: E402
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts  # noqa: E402
from nemo_rl_attn_align.vocab.errors import UsageError  # noqa: E402

NO_FLAGS = {"heads": None, "kv_heads": None, "head_dim": None, "window": None, "seq_len": None}


def shape_of(cfg, **flags):
    return drift_shape.resolve_shape(read_recipe_facts(cfg), {**NO_FLAGS, **flags})


def test_the_shape_is_the_models_as_megatron_builds_it_from_its_config_json():
    megatron = {"megatron_cfg": {"enabled": True}}
    s = shape_of({"policy": {"model_name": "Qwen/Qwen3-8B", "max_total_sequence_length": 512, **megatron}})
    assert (s.heads, s.kv_heads, s.head_dim, s.window, s.seq_len) == (32, 8, 128, None, 512)
    assert s.sources["heads"].startswith("Megatron-Bridge's reading of Qwen3ForCausalLM, from the architecture table")
    vllm = shape_of({"policy": {"model_name": "Qwen/Qwen2.5-1.5B"}})  # no Megatron: vLLM's reading
    assert vllm.kv_heads == 2 and vllm.sources["heads"].startswith("vLLM's reading of Qwen2ForCausalLM")


def test_priority_flags_then_drift_block_then_the_model_with_its_overrides():
    cfg = {
        "policy": {
            "model_name": "Qwen/Qwen3-8B",
            "megatron_cfg": {"enabled": True, "model_overrides": {"num_attention_heads": 16, "window_size": [255, 0]}},
            "hf_config_overrides": {"num_key_value_heads": 4},
        },
        "attention_align": {"drift": {"head_dim": 64}},
    }
    s = shape_of(cfg, heads=8)
    assert (s.heads, s.kv_heads, s.head_dim, s.window) == (8, 4, 64, 255)
    assert (s.sources["heads"], s.sources["head_dim"]) == ("flags", "attention_align.drift")
    assert s.sources["kv_heads"] == s.sources["window"] and "Megatron-Bridge" in s.sources["window"]
    assert shape_of(cfg).heads == 16  # model_overrides on the provider, as NeMo-RL merges them


def test_a_model_the_replays_do_not_model_is_said_so_not_swept_as_plain_attention(tmp_path):
    from tests.conftest import write_transformers_config

    model = write_transformers_config(tmp_path / "gpt-oss-like", "gpt_oss", num_hidden_layers=2)
    with pytest.raises(UsageError, match="learnable softmax sinks, which the replays do not model"):
        shape_of({"policy": {"model_name": str(model)}})
    assert shape_of({"policy": {"model_name": str(model)}}, heads=8, head_dim=64).heads == 8
    gemma2 = write_transformers_config(tmp_path / "gemma2-like", "gemma2", num_hidden_layers=2)
    with pytest.raises(UsageError, match="a logit soft cap of 50, which the replays do not model"):
        shape_of({"policy": {"model_name": str(gemma2)}})


@pytest.mark.parametrize(
    "cfg, flags, message",
    [
        ({"policy": {"model_name": "acme/unknown"}}, {}, "--heads N --kv-heads N --head-dim N"),
        (None, {"heads": 8}, "--head-dim"),
        (None, {"heads": 8, "kv_heads": 3, "head_dim": 8}, "not a multiple"),
        (None, {"heads": 0, "head_dim": 8}, "heads=0 is not a positive integer"),
    ],
)
def test_shape_errors_name_the_fix(cfg, flags, message):
    with pytest.raises(UsageError, match=message):
        shape_of(cfg, **flags)


def test_ulps_count_dtype_spacing():
    a = torch.tensor([1.0, 1.0, -0.5], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 1.0078125, -0.5], dtype=torch.bfloat16)  # one bf16 ulp above 1
    assert drift.ulps(a, b, torch.bfloat16).tolist() == [0.0, 1.0, 0.0]


SMALL = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--seq-len", "64", "--no-progress"]


def test_sweep_json_complete(tmp_path, write_yaml, capsys):
    cfg = write_yaml(
        "small.yaml",
        """
        policy:
          model_name: acme/tiny
          max_total_sequence_length: 64
        attention_align:
          drift: {heads: 4, kv_heads: 2, head_dim: 16}
    """,
    )
    out = tmp_path / "out"
    code = main(
        [
            "drift",
            str(cfg),
            "--json",
            "--no-progress",
            "--out",
            str(out),
            "--dtypes",
            "bf16,fp32",
            "--training",
            "reference",
            "--training",
            "te-p2p:cp=2",
            "--rollout",
            "reference",
            "--rollout",
            "vllm-fa3:chunk=16,splits=2",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((out / "drift-report.json").read_text())
    assert result["shape"]["sources"]["heads"] == "attention_align.drift" and result["shape"]["seq_len"] == 64
    assert (out / "drift-heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["heatmap"]
    from nemo_rl_attn_align.drift.drift_render import _cell

    # every cell says its figure, or why the pair did not run
    assert _cell(result, "bf16", "reference", "reference") == (0.0, "0\nbit-equal")
    assert _cell(result, "fp32", "te-p2p:cp=2", "reference")[1] == "not run:\nno fp32 kernel"
    assert math.isnan(_cell(result, "fp32", "reference", "vllm-fa3:chunk=16,splits=2")[0])
    width, height = _png_size(out / "drift-heatmap.png")
    assert width <= 1000 and height <= 1000  # read without zooming: two small panels stacked
    # fp32: only the reference runs (TE's flash path and vLLM reject fp32): no rows for the others
    assert len(result["pairs"]) == 2 * 2 + 1 and len(result["engines"]) == 3 + 1
    assert {(s["engine"], s["dtype"]) for s in result["skipped"]} == {
        ("te-p2p:cp=2", "fp32"),
        ("vllm-fa3:chunk=16,splits=2", "fp32"),
    }
    assert result["gpu"] == "sm90" and "thd" in result["replays"]["te-p2p:cp=2"]
    keys = {
        "out_abs_max",
        "out_abs_mean",
        "out_ulp_max",
        "out_ulp_mean",
        "out_beyond_1ulp",
        "lse_abs_max",
        "lse_abs_mean",
        "lse_ulp_max",
        "lse_ulp_mean",
        "logprob_abs_max",
        "logprob_abs_mean",
        "token_mult_prob_error",
        "bitwise_equal",
    }
    for pair in result["pairs"]:
        assert keys <= set(pair) and all(math.isfinite(pair[k]) for k in keys - {"bitwise_equal"})
    by = {(p["dtype"], p["training"], p["rollout"]): p for p in result["pairs"]}
    same = by[("bf16", "reference", "reference")]
    assert same["bitwise_equal"] and same["logprob_abs_max"] == 0 and same["token_mult_prob_error"] == 1.0
    drifted = by[("bf16", "te-p2p:cp=2", "vllm-fa3:chunk=16,splits=2")]
    assert not drifted["bitwise_equal"] and drifted["out_abs_max"] > 0 and drifted["token_mult_prob_error"] > 1.0
    for engine in result["engines"]:
        assert engine["vs_fp64"]["out_abs_max"] > 0 and engine["seconds"] >= 0
    reference = next(e for e in result["engines"] if e["engine"] == "reference" and e["dtype"] == "bf16")
    assert reference["vs_fp64"]["out_beyond_1ulp"] == 0 and reference["vs_fp64"]["out_ulp_max"] <= 1.0


def test_table_and_progress(tmp_path, capsys):
    code = main(
        [
            "drift",
            *SMALL[:-1],
            "--out",
            str(tmp_path),
            "--dtypes",
            "fp16",
            "--no-plot",
            "--training",
            "flash",
            "--rollout",
            "hf-eager",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and "fp16   flash" in captured.out and "mult_prob_err" in captured.out and ">1 ulp" in captured.out
    assert "replays: hf-eager = transformers" in captured.out
    assert "[" in captured.err and "fp16 hf-eager" in captured.err
    assert not (tmp_path / "drift-heatmap.png").exists()


def test_missing_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = main(
        ["drift", *SMALL, "--out", str(tmp_path), "--dtypes", "bf16", "--training", "flash", "--rollout", "flash"]
    )
    assert code == 0 and "matplotlib is not installed" in capsys.readouterr().err
    assert json.loads((tmp_path / "drift-report.json").read_text())["heatmap"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtypes", "bf8"], "unknown dtype bf8"),
        (["--training", "bogus"], "unknown engine 'bogus'"),
        (["--rollout", "vllm:chunk=x"], "not key=integer"),
        (["--training", "te-p2p:cp=3", "--seq-len", "64"], "not divisible by 2*cp=6"),
        (["--window", "8", "--training", "te-p2p:cp=2"], "te-allgather"),
        (["--window", "8", "--training", "te-p2p-bshd:cp=2"], "te-allgather"),
        (["--rollout", "vllm:chunk=16"], "Fix: pass --gpu sm80 or use vllm-fa3"),
        (["--gpu", "sm70"], "--gpu 'sm70': no kernel prediction for this GPU"),
        (["--vocab", "1"], "--vocab 1"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, argv, message):
    code = main(["drift", *SMALL, "--out", str(tmp_path / "never"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_unknown_model_without_flags(write_yaml, capsys):
    cfg = write_yaml("m.yaml", "policy:\n  model_name: acme/mystery\n")
    assert main(["drift", str(cfg)]) == 2
    assert "policy.model_name='acme/mystery'" in capsys.readouterr().err


def test_cli_help_does_not_import_torch():
    code = "import sys; from nemo_rl_attn_align.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_default_out_is_the_configs_report_dir(write_yaml, tmp_path, capsys):
    cfg = write_yaml(
        "c.yaml",
        f"""
        policy: {{model_name: x, max_total_sequence_length: 32}}
        logger: {{log_dir: {tmp_path / "logs"}}}
        attention_align: {{drift: {{heads: 2, kv_heads: 1, head_dim: 8}}}}
        """,
    )
    code = main(
        [
            "drift",
            str(cfg),
            "--no-progress",
            "--no-plot",
            "--dtypes",
            "bf16",
            "--training",
            "flash",
            "--rollout",
            "hf-eager",
        ]
    )
    assert code == 0
    assert (tmp_path / "logs" / "attention_align" / "drift-report.json").is_file()


def test_bad_drift_block_is_a_usage_error(write_yaml, tmp_path, capsys):
    cfg = write_yaml("c.yaml", "policy: {model_name: x}\nattention_align: {drift: {heads: -1}}\n")
    assert main(["drift", str(cfg), "--out", str(tmp_path / "never")]) == 2
    assert "attention_align.drift.heads" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_without_torch_drift_is_one_line_exit_2(write_yaml, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    cfg = write_yaml("c.yaml", "policy: {model_name: Qwen/Qwen3-8B}\n")
    assert main(["drift", str(cfg), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "drift needs torch" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists()


def test_an_override_the_host_cannot_build_leaves_the_model_unread_with_the_reason():
    policy = {"model_name": "Qwen/Qwen3-8B", "megatron_cfg": {"enabled": True}}
    with pytest.raises(UsageError, match="num_attention_heads='eight' is a string, not an integer from 1 to 1024"):
        shape_of({"policy": {**policy, "hf_config_overrides": {"num_attention_heads": "eight"}}})


def test_grpo_example_with_cp2_reports_thd_training_fa3_rollout_and_more_drift_than_bshd(capsys, tmp_path):
    code = main(
        [
            "drift",
            "policy.megatron_cfg.context_parallel_size=2",
            "--json",
            "--no-progress",
            "--no-plot",
            "--out",
            str(tmp_path),
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "32",
            "--seq-len",
            "256",
            "--dtypes",
            "bf16",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["gpu"] == "sm90" and result["config"].endswith("grpo_math_1B_megatron_flash.yaml")
    assert result["training"] == ["reference", "te-p2p:cp=2", "te-p2p-bshd:cp=2"]
    assert result["rollout"] == ["reference", "vllm-fa3:chunk=256"]  # seq 256: no room for a cascaded prompt
    assert "qkv_format thd" in result["replays"]["te-p2p:cp=2"] and "FA3" in result["replays"]["vllm-fa3:chunk=256"]
    vs_ref = {e["engine"]: e["vs_reference"] for e in result["engines"]}
    assert vs_ref["te-p2p:cp=2"]["out_abs_mean"] > vs_ref["te-p2p-bshd:cp=2"]["out_abs_mean"]
    assert vs_ref["te-p2p:cp=2"]["out_beyond_1ulp"] > vs_ref["te-p2p-bshd:cp=2"]["out_beyond_1ulp"]


def _default_engines(mc, gpu="sm90", head_dim=128, generation=None, model="Qwen/Qwen3-8B"):
    cfg = {
        "policy": {
            "model_name": model,
            "precision": "bfloat16",
            "megatron_cfg": {"enabled": True, **mc},
            "generation": {"backend": "vllm", "vllm_cfg": {"precision": "bfloat16"}, **(generation or {})},
        }
    }
    shape = drift_shape.Shape(16, 8, head_dim, None, 1024)
    training, rollout = drift_shape.default_engines(read_recipe_facts(cfg, {}), gpu, shape, environ={})
    return list(training.specs), list(rollout.specs), [*rollout.notes(), *training.notes()]


def test_default_engines_follow_the_predicted_kernels():
    training, rollout, notes = _default_engines({"attention_backend": "flash"})
    assert (training, rollout) == (
        ["reference", "flash"],
        ["reference", "vllm-fa3:chunk=256", "vllm-fa3:chunk=256,cascade=512"],
    )
    assert any(n.startswith("training kernel: FlashAttention 2.8.3 (Transformer Engine") for n in notes)
    assert any(n.startswith("rollout kernel: FLASH_ATTN FA3 (vLLM") for n in notes)
    assert _default_engines({"attention_backend": "auto"})[0] == ["reference", "te-fused"]  # TE picks cuDNN on sm90
    assert _default_engines({"attention_backend": "auto"}, "sm80")[:2] == (
        ["reference", "flash"],
        ["reference", "vllm:chunk=256", "vllm:chunk=256,cascade=512"],
    )
    assert _default_engines({"transformer_impl": "local"})[0] == ["reference", "megatron-local"]
    assert _default_engines({"attention_backend": "flash", "context_parallel_size": 4})[0] == [
        "reference",
        "te-p2p:cp=4",
        "te-p2p-bshd:cp=4",
    ]


def test_default_engines_say_when_a_side_is_not_replayed_or_assumed():
    # TE's unfused attention: no materializer, the side is the reference only, and the notes say so
    training, _, notes = _default_engines({"attention_backend": "unfused"})
    assert training == ["reference"]
    assert "no materializer replays UnfusedDotProductAttention: the training side is the reference only" in notes
    # a model whose config.json is not here: the selector cannot answer, TE's preference is assumed
    training, rollout, notes = _default_engines({"attention_backend": "auto"}, "sm80", model="acme/absent")
    assert training == ["reference", "flash"] and rollout[1] == "vllm:chunk=256"
    assert any(n.startswith("training kernel assumed FlashAttention: the selector's answer is pending") for n in notes)


def test_the_engine_prediction_is_a_structure_not_notes_to_parse():
    cfg = {"policy": {"model_name": "acme/absent", "precision": "bfloat16", "megatron_cfg": {"enabled": True}}}
    cfg["policy"]["generation"] = {"backend": "vllm", "vllm_cfg": {"precision": "bfloat16"}}
    shape = drift_shape.Shape(16, 8, 128, None, 1024)
    training, rollout = drift_shape.default_engines(read_recipe_facts(cfg, {}), "sm80", shape, environ={})
    assert (training.side, training.engines, training.assumed) == ("training", ("flash",), True)
    assert training.kernel is not None and training.kernel.kernel == "FlashAttention"  # TE's preference on sm80
    assert "acme/absent" in training.why and training.unreplayed == "FlashAttention"
    assert (rollout.side, rollout.assumed, rollout.unreplayed) == ("rollout", True, "FLASH_ATTN FA2 on sm80")
    cfg["policy"]["megatron_cfg"]["attention_backend"] = "unfused"
    training, _ = drift_shape.default_engines(read_recipe_facts(cfg, {}), "sm80", shape, environ={})
    assert training.engines == () and training.kernel.kernel == "UnfusedDotProductAttention"


def test_not_replayable_engine_is_listed_without_figures(capsys, tmp_path):
    code = main(
        [
            "drift",
            "policy.megatron_cfg.attention_backend=fused",
            *SMALL,
            "--out",
            str(tmp_path),
            "--no-plot",
            "--dtypes",
            "bf16",
            "--rollout",
            "reference",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "not replayable: te-fused" in out and "cuDNN" in out
    report = json.loads((tmp_path / "drift-report.json").read_text())
    assert report["not_replayable"] == ["te-fused"]
    assert all(p["training"] != "te-fused" for p in report["pairs"]) and report["pairs"]


def _png_size(path) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk."""
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
