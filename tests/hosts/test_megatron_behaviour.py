"""``hosts.megatron_behaviour`` on real megatron-core GPTModels on CPU (local layer spec): the RoPE each
layer applies, evaluated, against the closed form and Hugging Face's own YaRN; the mask and softmax
its core attention holds; the model left as it was.

megatron-core's TE layer spec does not build on CPU with the Transformer Engine stand-in (its CPU
offload context needs TE), so Transformer Engine's modules are read in the nemo_rl lane.
``probe.megatron_side.cpu_only`` stands in for a GPU where megatron-core asks for one while building
(YaRN's constructor, sinks).
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("megatron.core")

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

from nemo_rl_attn_align.binding.behaviour_difference import difference
from nemo_rl_attn_align.hosts import megatron_behaviour
from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel, own_nvte_environment
from nemo_rl_attn_align.vocab.behaviour import layer_kinds
from tests.behaviour_samples import default_rates, rope_kind, rope_value

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2}
HEAD_DIM = 16


@dataclasses.dataclass
class YarnConfig(TransformerConfig):
    """The YaRN fields GPTModel reads from its config (Megatron-Bridge's provider declares them)."""

    yarn_rotary_scaling_factor: float = 32.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None
    yarn_correction_range_round_to_int: bool = False


@pytest.fixture(autouse=True)
def _own_nvte_variables():
    """Megatron asserts the NVTE_* variables fit the backend, then sets them: each build starts with
    none, and the test leaves them as it found them."""
    with own_nvte_environment():
        yield


def gpt(config_class=TransformerConfig, gpt_args: dict | None = None, **config) -> GPTModel:
    ensure_model_parallel()
    cfg = config_class(**{**TINY, "use_cpu_initialization": True, **config})
    with cpu_only():
        return GPTModel(
            config=cfg,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=128,
            max_sequence_length=64,
            **{"position_embedding_type": "rope", **(gpt_args or {})},
        )


def read(model) -> dict:
    fields, problems = megatron_behaviour.read(model)
    assert problems == []
    return fields


def same_rope(measured, kind: dict) -> bool:
    return difference("rope", measured, rope_value(dict.fromkeys(range(TINY["num_layers"]), kind))) is None


@pytest.mark.parametrize(
    "gpt_args, config, expected",
    [
        ({}, {}, rope_kind(default_rates(HEAD_DIM, 10000.0), HEAD_DIM)),
        ({"rotary_base": 500000}, {}, rope_kind(default_rates(HEAD_DIM, 500000.0), HEAD_DIM)),
        ({"rotary_percent": 0.5}, {}, rope_kind(default_rates(HEAD_DIM // 2, 10000.0), HEAD_DIM)),
        ({}, {"rotary_interleaved": True}, rope_kind(default_rates(HEAD_DIM, 10000.0), HEAD_DIM, interleaved=True)),
    ],
    ids=["default", "rotary_base", "rotary_percent_0.5", "rotary_interleaved"],
)
def test_rope_is_the_rotation_each_layer_applies(gpt_args, config, expected):
    rope = read(gpt(gpt_args=gpt_args, **config))["rope"]
    assert rope.provenance.value == "observed"
    [kind] = rope.value["kinds"]
    assert kind["pairs"] == expected["pairs"]  # half-split [[i, i + n]] or adjacent [[2i, 2i + 1]]
    assert same_rope(rope.value, expected)
    assert not same_rope(rope.value, rope_kind(default_rates(HEAD_DIM, 20000.0), HEAD_DIM, **_layout(config)))
    assert "rotary_pos_emb (RotaryEmbedding)" in rope.source and "decoder.layers[0-3].self_attention" in rope.source


def _layout(config: dict) -> dict:
    return {"interleaved": config.get("rotary_interleaved", False)}


@pytest.mark.parametrize("round_to_int", [False, True])
def test_yarn_rope_is_hugging_faces_with_its_attention_factor(round_to_int):
    """gpt-oss's YaRN (factor 32, band unrounded: HF's truncate false). Megatron rounding the band is
    upstream's "RoPE that differs while the configs agree": the fingerprints then differ."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = gpt(
        YarnConfig,
        {"position_embedding_type": "yarn", "rotary_base": 150000},
        yarn_correction_range_round_to_int=round_to_int,
    )
    rope = read(model)["rope"]
    hf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    expected = rope_kind(inv_freq.tolist(), HEAD_DIM, scale=attention_factor)
    assert rope.value["kinds"][0]["scales"] == pytest.approx([attention_factor] * (HEAD_DIM // 2), rel=1e-6)
    assert same_rope(rope.value, expected) is not round_to_int
    assert "mscale=1.34657" in rope.source


def test_mask_and_softmax_are_what_each_core_attention_holds():
    model = gpt(window_size=(7, 0), window_attn_skip_freq=2, softmax_scale=0.125, softmax_type="learnable")
    fields = read(model)
    mask = layer_kinds(fields["mask"].value)
    assert mask == {
        0: {"causal": True, "window": 7},  # layer_number 1: 1 % 2 != 0, windowed
        1: {"causal": True, "window": None},
        2: {"causal": True, "window": 7},
        3: {"causal": True, "window": None},
    }
    assert fields["softmax"].value["kinds"] == [{"scale": 0.125, "softcap": None, "sinks": "learnable"}]
    assert fields["mask"].source == (
        "DotProductAttention.scale_mask_softmax.window_size/attn_mask_type "
        "of decoder.layers[0-3].self_attention.core_attention"
    )


def test_default_softmax_scale_and_no_rotary():
    fields = read(gpt(gpt_args={"position_embedding_type": "none"}))
    assert all(kind["pairs"] == [] and kind["head_dim"] == HEAD_DIM for kind in fields["rope"].value["kinds"])
    assert "position_embedding_type none" in fields["rope"].source
    [softmax] = fields["softmax"].value["kinds"]
    assert softmax == {"scale": 0.25, "softcap": None, "sinks": "none"}  # 1/sqrt(16)


def test_reading_leaves_the_model_as_it_was_and_fused_rope_is_evaluated_unfused():
    model = gpt()
    model.config.apply_rope_fusion = True  # as NeMo-RL sets it; TE's fused kernel would run it
    rotary = model.rotary_pos_emb
    inv_freq = rotary.inv_freq
    cached = RotaryEmbedding.forward.cache_info().currsize
    rope = read(model)["rope"]
    assert rotary.inv_freq is inv_freq and inv_freq.device.type == "cpu"
    assert RotaryEmbedding.forward.cache_info().currsize == cached
    assert model.config.apply_rope_fusion is True
    assert "unfused (apply_rope_fusion on" in rope.source
    assert same_rope(rope.value, rope_kind(default_rates(HEAD_DIM, 10000.0), HEAD_DIM))


def test_wrapped_chunks_are_read_and_an_unknown_core_attention_is_unobservable_with_the_reason():
    class Wrapper(torch.nn.Module):  # DDP and Float16Module keep the model as .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = gpt()
    assert read([Wrapper(Wrapper(model))])["mask"].provenance.value == "observed"
    model.decoder.layers[2].self_attention.core_attention = torch.nn.Identity()
    fields = read([Wrapper(model)])
    assert fields["mask"].provenance.value == "unobservable"
    assert fields["mask"].source == (
        "decoder.layers[2].self_attention: torch.nn.modules.linear.Identity: no reader for this core attention"
    )
    assert fields["rope"].provenance.value == "observed"


def test_a_model_without_attention_layers_is_unobservable():
    fields, problems = megatron_behaviour.read(torch.nn.Linear(2, 2))
    assert problems == [] and {f.provenance.value for f in fields.values()} == {"unobservable"}
    assert "has no decoder.layers" in fields["rope"].source
