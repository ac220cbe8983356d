"""The model's local config.json: found without the network; the identity it fixes for both sides alike."""

from __future__ import annotations

import json
import math

from nemo_rl_attn_align.compare.binding import Status
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.hf_model import identity_fields
from nemo_rl_attn_align.preflight.model_config import find_config, load_model_config, not_found_line
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
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
    assert identity_fields(QWEN3) == {
        "architecture": "Qwen3ForCausalLM",
        "vocab_size": 151936,
        "softmax_scale": 1.0 / math.sqrt(128),
        "logit_softcapping": None,
        "rope_type": "default",
        "rope_parameters": {"theta": 1000000.0, "partial_rotary_factor": 1.0},
    }


def test_multi_latent_attention_leaves_the_scale_to_the_engines():
    mla = {**QWEN3, "architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert "softmax_scale" not in identity_fields(mla)


def test_transformers_5_rope_parameters_mean_the_same_as_rope_theta():
    v5 = {**QWEN3, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000}}
    del v5["rope_theta"], v5["rope_scaling"]
    assert identity_fields(v5)["rope_parameters"] == identity_fields(QWEN3)["rope_parameters"]


def test_gemma2_scale_and_softcapping():
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
    assert fields["architecture"] == "Qwen2_5_VLForConditionalGeneration" and fields["vocab_size"] == 151936


def test_preview_compares_identity_before_launch(tmp_path):
    model = write_model(tmp_path / "qwen3", QWEN3)
    cfg = load_config(
        EXAMPLES / "grpo_math_1B_megatron_flash.yaml",
        [f"policy.model_name={model}", "++policy.tokenizer.name=" + str(model), "++attention_align.preset=aligned"],
    )
    preview = preview_of(cfg)
    identity = [r for r in preview.binding.results if r.tier.value == "identity" and r.binds]
    assert all(r.status.value == "match" for r in identity), [(r.name, r.status) for r in identity]
    assert {r.name for r in preview.binding.with_status(Status.NOT_COMPARABLE)} >= set(BEHAVIOUR_FIELDS)  # pending
    assert any(str(model) in note for note in preview.notes)


def test_training_overrides_break_identity_before_launch(tmp_path):
    model = write_model(tmp_path / "qwen3", QWEN3)
    cfg = load_config(
        EXAMPLES / "grpo_math_1B_megatron_flash.yaml",
        [f"policy.model_name={model}", "++policy.megatron_cfg.model_overrides.num_layers=27"],
    )
    result = preview_of(cfg).binding.result("num_layers")
    assert result.status.value == "mismatch" and (result.training.value, result.rollout.value) == (27, 28)


def test_a_missing_config_says_where_it_was_looked_for_and_how_to_fetch_it(tmp_path):
    line = not_found_line("Qwen/Qwen3-0.6B", {"HF_HUB_CACHE": str(tmp_path)})
    assert str(tmp_path / "models--Qwen--Qwen3-0.6B") in line and "Qwen/Qwen3-0.6B/config.json" in line
    assert line.endswith("fetch just that file: hf download Qwen/Qwen3-0.6B config.json")
    assert "no /ckpt/hf/config.json" in not_found_line("/ckpt/hf", {})
