"""The model's local config.json: found without the network, mapped onto the identity fields."""

from __future__ import annotations

import json
import math

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.hf_model import find_config, identity_fields, load_model_config
from tests.conftest import EXAMPLES, preview_of

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
    "vocab_size": 151936,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
}


def write_model(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_local_directory_and_hub_cache_are_found_never_fetched(tmp_path):
    local = write_model(tmp_path / "my-model", QWEN3)
    assert find_config(str(local), {}) == local / "config.json"
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--Qwen--Qwen3-0.6B"
    write_model(repo / "snapshots" / "abc123", QWEN3)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    assert (
        find_config("Qwen/Qwen3-0.6B", {"HF_HOME": str(tmp_path / "hf")})
        == repo / "snapshots" / "abc123" / "config.json"
    )
    assert find_config("Qwen/Qwen3-0.6B", {"HF_HUB_CACHE": str(cache)}) is not None
    assert find_config("Qwen/Qwen3-8B", {"HF_HUB_CACHE": str(cache)}) is None
    assert find_config(None, {}) is None
    assert find_config("x" * 300, {}) is None and find_config("a/" + "x" * 300, {"HF_HUB_CACHE": str(cache)}) is None
    assert find_config("bad\0name", {}) is None


def test_unusable_files_are_skipped(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    assert load_model_config(str(tmp_path / "m"), {}) is None
    (tmp_path / "m" / "config.json").write_text("{broken")
    assert load_model_config(str(tmp_path / "m"), {}) is None


def test_identity_of_a_plain_gqa_model():
    fields = identity_fields(QWEN3)
    assert fields == {
        "architecture": "Qwen3ForCausalLM",
        "num_layers": 28,
        "num_attention_heads": 16,
        "vocab_size": 151936,
        "num_query_groups": 8,
        "head_dim": 128,
        "softmax_scale": 1.0 / math.sqrt(128),
        "sliding_window": None,
        "layer_windows": [None] * 28,
        "logit_softcapping": None,
        "rope_type": "default",
        "rope_parameters": {"theta": 1000000.0, "partial_rotary_factor": 1.0},
    }


def test_transformers_5_rope_parameters_mean_the_same_as_rope_theta():
    v5 = {**QWEN3, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000}}
    del v5["rope_theta"], v5["rope_scaling"]
    assert identity_fields(v5)["rope_parameters"] == identity_fields(QWEN3)["rope_parameters"]


def test_gemma2_scale_softcapping_model_and_mixed_windows():
    gemma2 = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_size": 128,
        "vocab_size": 1000,
        "query_pre_attn_scalar": 64,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    fields = identity_fields(gemma2)
    assert math.isclose(fields["softmax_scale"], 64**-0.5)
    assert "sliding_window" not in fields  # one window per layer: left to the engines' records
    assert fields["layer_windows"] == [15, None]  # the window per layer, as the kernels receive it
    assert identity_fields({**gemma2, "attn_logit_softcapping": 50.0})["logit_softcapping"] == 50.0


def test_multimodal_text_config_is_used(tmp_path):
    vlm = write_model(
        tmp_path / "vlm",
        {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "vision_config": {"num_attention_heads": 12},
            "text_config": QWEN3,
        },
    )
    fields = identity_fields(load_model_config(str(vlm), {}).config)
    assert fields["architecture"] == "Qwen2_5_VLForConditionalGeneration" and fields["num_attention_heads"] == 16


def test_preview_compares_identity_before_launch(tmp_path):
    model = write_model(tmp_path / "qwen3", QWEN3)
    cfg = load_config(
        EXAMPLES / "grpo_math_1B_megatron_flash.yaml",
        [f"policy.model_name={model}", "++policy.tokenizer.name=" + str(model), "++attention_align.preset=aligned"],
    )
    preview = preview_of(cfg)
    identity = [r for r in preview.binding.results if r.tier.value == "identity"]
    assert all(r.status.value == "match" for r in identity), [(r.name, r.status) for r in identity]
    assert any(str(model) in note for note in preview.notes)


def test_training_overrides_break_identity_before_launch(tmp_path):
    model = write_model(tmp_path / "qwen3", QWEN3)
    cfg = load_config(
        EXAMPLES / "grpo_math_1B_megatron_flash.yaml",
        [f"policy.model_name={model}", "++policy.megatron_cfg.model_overrides.num_layers=27"],
    )
    result = preview_of(cfg).binding.result("num_layers")
    assert result.status.value == "mismatch" and (result.training.value, result.rollout.value) == (27, 28)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_identity_matches_what_transformers_writes(tmp_path, model_type):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    config = transformers.AutoConfig.for_model(
        model_type, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=128, vocab_size=1000
    )
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"]
    config.save_pretrained(tmp_path)
    fields = identity_fields(load_model_config(str(tmp_path), {}).config)
    assert (fields["num_attention_heads"], fields["num_query_groups"], fields["head_dim"]) == (
        4,
        2,
        getattr(config, "head_dim", None) or 32,
    )
    assert fields["rope_parameters"]["theta"] == float(
        getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    )


def test_drift_takes_the_shape_from_the_local_config_before_the_builtin_table(tmp_path):
    from nemo_rl_attn_align.drift.shape import resolve_shape

    model = write_model(
        tmp_path / "qwen3", {**QWEN3, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}
    )
    shape = resolve_shape({"policy": {"model_name": str(model)}}, {})
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.window) == (8, 4, 64, None)
    assert shape.sources["heads"] == str(model / "config.json")
