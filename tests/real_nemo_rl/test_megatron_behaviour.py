"""The behaviour the Megatron worker records (``hosts.megatron_behaviour``) for models Megatron-Bridge
0.6.2 builds, against Hugging Face's own model of the same tiny config (``bridge_behaviour``, one
subprocess: megatron-core must be imported before the Transformer Engine stand-in there, while this
lane's other modules load the stand-in first). Windows in visible tokens, Gemma 2's layer kinds in
Hugging Face's order, RoPE angles and YaRN's attention factor, scales, soft caps and sinks agree
within ``binding.behaviour_difference``'s tolerance. The upstream bugs these fields catch are re-introduced and
caught end to end in ``tests/upstream_bugs``.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import module_json
from tests.real_nemo_rl.conftest import LANE_VARIABLE

pytestmark = pytest.mark.real_nemo_rl

MODELS = ("llama", "qwen3", "mistral", "gemma2", "gemma3_text", "gpt_oss")
WINDOW = 8  # bridge_behaviour.WINDOW: Hugging Face's sliding_window, the query included


@pytest.fixture(scope="module")
def built() -> dict:
    if os.environ.get(LANE_VARIABLE) != "nemo_rl":
        pytest.skip(f"runs in lane .ci/lanes/nemo_rl.sh ({LANE_VARIABLE}=nemo_rl), whose venv has Megatron-Bridge")
    return module_json("tests.real_nemo_rl.bridge_behaviour")


def _checked(field: str, value: dict) -> dict:
    from nemo_rl_attn_align.vocab import behaviour

    return getattr(behaviour, field)(value, field)


@pytest.mark.parametrize("model_type", MODELS)
def test_each_models_behaviour_is_hugging_faces(built, model_type):
    from nemo_rl_attn_align.binding.behaviour_difference import difference

    seen = built[model_type]
    assert seen["problems"] == []
    # Gemma 3's core attention is Transformer Engine's (not built here): its mask is not read
    fields = ("rope", "softmax") if model_type == "gemma3_text" else ("rope", "mask", "softmax")
    for field in fields:
        provenance, value, source = seen["training"][field]
        assert provenance == "observed", source
        found = difference(field, _checked(field, value), _checked(field, seen["hf"][field]))
        assert found is None, found


def test_converter_modules_are_read_where_they_run(built):
    from nemo_rl_attn_align.vocab.behaviour import layer_kinds

    mistral = layer_kinds(built["mistral"]["training"]["mask"][1])
    assert set(map(str, mistral.values())) == {str({"causal": True, "window": WINDOW - 1})}  # W tokens seen
    gemma2 = built["gemma2"]["training"]
    assert [k["window"] for k in layer_kinds(gemma2["mask"][1]).values()] == [WINDOW - 1, None, WINDOW - 1, None]
    assert gemma2["mask"][2].startswith("Gemma2FlexDotProductAttention.window_size of decoder.layers[0-3]")
    assert {k["softcap"] for k in layer_kinds(gemma2["softmax"][1]).values()} == {50.0}
    gemma3 = built["gemma3_text"]["training"]["rope"]
    assert gemma3[1]["layers"] == [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0], [5, 1]]  # every 6th layer global
    assert "rope_local (Gemma3RotaryEmbedding, local layer)" in gemma3[2]
    gpt_oss = built["gpt_oss"]["training"]["rope"]
    assert "YarnRotaryEmbedding" in gpt_oss[2] and "mscale=1.34657" in gpt_oss[2]


@pytest.mark.parametrize("model_type", MODELS)
def test_checks_preview_computes_what_the_built_model_records(built, model_type):
    """``check --training-python``'s side (``hosts.behaviour_preview``: the model on the meta device, its
    rotary on the CPU) gives the values and sources the reader records from the model built with its
    weights, exactly; Gemma 3's mask and softmax are unobservable there (its core attention is TE's own)."""
    seen = built[model_type]
    preview = seen["preview"]
    assert "error" not in preview and preview["problems"] == [], preview
    for field, (provenance, value, source) in seen["training"].items():
        got = preview["fields"][field]
        if model_type == "gemma3_text" and field != "rope":
            assert got["provenance"] == "unobservable", got
            assert got["source"].startswith("gemma3_layer_spec's core attention needs Transformer Engine"), got
            continue
        assert (got["provenance"], got["value"], got["source"]) == (provenance, value, source), field
