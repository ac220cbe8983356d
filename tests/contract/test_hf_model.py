"""The model's local config.json: found without the network; the identity it fixes for both sides alike."""

from __future__ import annotations

import json
import math
import os

import pytest

from nemo_rl_attn_align.binding.binding import Status
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.contract_preview import identity_fields
from nemo_rl_attn_align.model.model_config import find_config, load_model_config, not_found_line
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


def test_missing_unreadable_and_malformed_say_so_in_one_line(tmp_path):
    model = tmp_path / "m"
    missing = load_model_config(str(model), {})
    assert missing.missing and "no " in missing.line and "on this machine" in missing.line
    model.mkdir()
    for text, said in (("[1, 2]", "holds a list, not a JSON object"), ("{broken", "is not valid JSON (Expecting")):
        (model / "config.json").write_text(text)
        found = load_model_config(str(model), {})
        assert not found.missing and said in found.line and "\n" not in found.line
    (model / "config.json").unlink()
    (model / "config.json").mkdir()
    assert "is a directory, not a regular file" in load_model_config(str(model), {}).line
    (model / "config.json").rmdir()
    os.mkfifo(model / "config.json")  # opened without blocking, refused without reading
    assert "is a FIFO (named pipe), not a regular file" in load_model_config(str(model), {}).line


def test_a_cached_config_that_cannot_be_read_is_named_with_the_command_that_fetches_it(tmp_path):
    snapshot = tmp_path / "models--org--m" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{")
    found = load_model_config("org/m", {"HF_HUB_CACHE": str(tmp_path)})
    assert str(snapshot / "config.json") in found.line and "hf download org/m config.json" in found.line


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("num_hidden_layers", 2.5, "num_hidden_layers=2.5 is a float, not an integer from 1 to 1024"),
        ("num_hidden_layers", "28", "num_hidden_layers='28' is a string, not an integer"),
        ("num_hidden_layers", 10**8, "num_hidden_layers=100000000 is not an integer from 1 to 1024"),
        ("num_hidden_layers", None, "num_hidden_layers=None is null, not an integer"),
        ("num_attention_heads", True, "num_attention_heads=True is a boolean, not an integer"),
        ("head_dim", 0, "head_dim=0 is not an integer from 1 to 4096"),
        ("rope_theta", float("nan"), "rope_theta=nan is not a number above 0"),
        ("use_sliding_window", "false", "use_sliding_window='false' is a string, not true or false"),
        ("layer_types", ["full_attention"] * 2000, "has 2000 entries, over the limit of 1024 layers"),
        ("rope_scaling", [1], "rope_scaling=[1] is a list, not a mapping"),
    ],
)
def test_a_value_over_a_limit_names_the_file_the_key_the_value_and_the_limit(tmp_path, key, value, said):
    found = load_model_config(str(write_model(tmp_path / "m", {**QWEN3, key: value})), {})
    assert not found.missing and str(tmp_path / "m" / "config.json") in found.line and said in found.line
    assert found.line.count("\n") == 0 and "Limits on input" in found.line


def test_nested_text_configs_and_rope_parameters_are_checked_as_the_top_level(tmp_path):
    vlm = {"architectures": ["X"], "text_config": {**QWEN3, "num_key_value_heads": -1}}
    assert "text_config.num_key_value_heads=-1" in load_model_config(str(write_model(tmp_path / "a", vlm)), {}).line
    v5 = {**QWEN3, "rope_parameters": {"rope_type": "default", "rope_theta": float("inf")}}
    assert "rope_parameters.rope_theta=inf" in load_model_config(str(write_model(tmp_path / "b", v5)), {}).line
    deep: list = [1]
    for _ in range(40):
        deep = [deep]
    deep_config = {**QWEN3, "quantization_config": {"x": deep}}
    assert "nests deeper than 32 levels" in load_model_config(str(write_model(tmp_path / "c", deep_config)), {}).line
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    assert "an integer of 5000 digits" in load_model_config(str(tmp_path / "d"), {}).line


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
