"""The behaviour fields (``rope``, ``mask``, ``softmax``) real vLLM engines record
(``hosts.vllm_behaviour``, from the ``vllm.general_plugins`` entry point), held against what Hugging
Face's own modules compute for the same ``config.json`` (``hf_behaviour.py``), within
``binding.behaviour_difference``'s tolerances: default RoPE (qwen3, mistral), Gemma 2's interleaved windows and
soft cap, Gemma 3's local and global RoPE, GLM-4's partial rotary in adjacent pairs, gpt-oss's YaRN
(``truncate: false``) and sinks. Then vLLM #27722 re-introduced into a gpt-oss engine
(``reverts.py``): the configuration fields stay equal, the rope differs, and ``binding.behaviour_difference``
names the layer, the position and the channels.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest

from nemo_rl_attn_align.binding.behaviour_difference import difference
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS, ROPE_POSITIONS, layer_kinds
from tests.real_vllm.hf_behaviour import hf_behaviour

pytestmark = pytest.mark.real_vllm

MEASURED = ("qwen3", "mistral", "gemma2", "gemma3", "glm4", "gpt-oss")
#: What each engine's record must show, beside agreeing with Hugging Face: the positions its
#: cos_sin_cache serves (default RoPE: max_position_embeddings, 512; YaRN: 4096 x 32), the pairs of
#: each rope kind (h: half-split over n channels, a: adjacent), the layers' windows, soft caps, sinks.
SHOWN = {
    "qwen3": ([1, 61], [["h", 32]], [None, None], [None], ["none"]),
    "mistral": ([1, 61], [["h", 32]], [63, 63], [None], ["none"]),
    "gemma2": ([1, 61], [["h", 32]], [63, None], [50.0], ["none"]),
    "gemma3": ([1, 61], [["h", 32], ["h", 32]], [63, None], [None], ["none"]),
    "glm4": ([1, 61], [["a", 16]], [None, None], [None], ["none"]),
    "gpt-oss": (list(ROPE_POSITIONS), [["h", 32]], [63, None], [None], ["learnable"]),
}


def fields(engine) -> dict:
    return engine.record()["contract"]["fields"]


@cache
def hugging_face(model_dir: Path) -> dict:
    return hf_behaviour(model_dir)


def _pairs(kind: dict) -> list:
    n = len(kind["pairs"])
    if kind["pairs"] == [[i, i + n] for i in range(n)]:
        return ["h", 2 * n]
    return ["a", 2 * n] if kind["pairs"] == [[2 * i, 2 * i + 1] for i in range(n)] else kind["pairs"]


def shown(recorded: dict) -> tuple:
    rope, mask, softmax = (recorded[name]["value"] for name in BEHAVIOUR_FIELDS)
    return (
        rope["positions"],
        [_pairs(kind) for kind in rope["kinds"]],
        [kind["window"] for kind in layer_kinds(mask).values()],
        sorted({kind["softcap"] for kind in softmax["kinds"]}, key=str),
        sorted({kind["sinks"] for kind in softmax["kinds"]}),
    )


@pytest.mark.parametrize("name", MEASURED)
def test_the_recorded_behaviour_is_what_hugging_face_computes(engines, name):
    engine = engines(name)
    recorded, expected = fields(engine), hugging_face(engine.model)
    for field in BEHAVIOUR_FIELDS:
        assert recorded[field]["provenance"] == "observed", (field, recorded[field]["source"])
        found = difference(field, expected[field], recorded[field]["value"])
        assert found is None, found
    assert shown(recorded) == SHOWN[name]
    assert "rotary_emb" in recorded["rope"]["source"] and "impl.sliding_window" in recorded["mask"]["source"]
    assert all(kind["causal"] for kind in recorded["mask"]["value"]["kinds"])


def test_gemma3_local_and_global_layers_rotate_at_their_own_rates(engines):
    rope = fields(engines("gemma3"))["rope"]["value"]
    local, global_ = (layer_kinds(rope)[i] for i in (0, 1))
    # position 1: the first pair turns by one radian on both; the global layer's linear scaling divides by 8
    assert local["angles"][0][0] == pytest.approx(1.0) and global_["angles"][0][0] == pytest.approx(1 / 8)
    assert "LinearScalingRotaryEmbedding" in fields(engines("gemma3"))["rope"]["source"]


def test_positions_past_the_cache_are_named_in_the_source(engines):
    source = fields(engines("qwen3"))["rope"]["source"]
    assert "positions 4093, 131071 not evaluated: past the 512 positions of the cos_sin_cache" in source
    assert "not evaluated" not in fields(engines("gpt-oss"))["rope"]["source"]


def _first_moved_pair(config: dict) -> int:
    """The first pair whose YaRN ramp moves when the correction range is rounded (the band's ends
    floored and ceiled), from the YaRN formula (Peng et al.) on the model's config alone."""
    rope, head_dim = config["rope_parameters"], config["head_dim"]

    def dim(rotations: float) -> float:
        ratio = rope["original_max_position_embeddings"] / (rotations * 2 * math.pi)
        return head_dim * math.log(ratio) / (2 * math.log(rope["rope_theta"]))

    low, high = dim(rope["beta_fast"]), dim(rope["beta_slow"])

    def ramp(i: int, lo: float, hi: float) -> float:
        return min(max((i - lo) / (hi - lo), 0.0), 1.0)

    rounded = (math.floor(low), math.ceil(high))
    return next(i for i in range(head_dim // 2) if ramp(i, low, high) != ramp(i, *rounded))


def test_vllm_27722_reintroduced_changes_the_rope_only_and_is_named(engines, tmp_path):
    fixed_engine, reverted_engine = engines("gpt-oss"), engines("gpt-oss-27722")
    fixed, reverted = fields(fixed_engine), fields(reverted_engine)
    config = json.loads((fixed_engine.model / "config.json").read_text())
    assert config["rope_parameters"]["truncate"] is False
    # Both engines read the same config.json: every configuration field agrees.
    for name in ("rope_type", "rope_parameters", "layer_windows", "softmax_scale"):
        assert fixed[name]["value"] == reverted[name]["value"], name
    assert reverted["rope"]["provenance"] == "observed"
    found = difference("rope", fixed["rope"]["value"], reverted["rope"]["value"])
    assert found is not None and (found.field, found.layer, found.position) == ("rope", 0, 1), found
    pair = _first_moved_pair(config)
    assert f"layer 0, position 1, channels {pair}/{pair + config['head_dim'] // 2}:" in found.message, found.message
    assert re.search(r"training rotates by \S+ rad, rollout by \S+ rad", found.message)
    assert fixed["mask"] == reverted["mask"] and fixed["softmax"] == reverted["softmax"]
    # The reverted engine computes what Hugging Face computes for truncate: true, the fixed one truncate: false.
    truncated = tmp_path / "gpt-oss-truncate-true"
    truncated.mkdir()
    config["rope_parameters"]["truncate"] = True
    (truncated / "config.json").write_text(json.dumps(config))
    assert difference("rope", hugging_face(truncated)["rope"], reverted["rope"]["value"]) is None
    assert difference("rope", hugging_face(fixed_engine.model)["rope"], fixed["rope"]["value"]) is None
