"""Megatron's and Hugging Face's RoPE spellings map onto one canonical form."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nemo_rl_attn_align.binding.binding import same_value
from nemo_rl_attn_align.contract.rope import canonical_rope, hf_rope, megatron_scaling

# Llama-3.1-8B's HF config.json values.
LLAMA31_HF = SimpleNamespace(
    rope_theta=500000.0,
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
)
LLAMA31_HF_V5 = SimpleNamespace(
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
)
# What Megatron-Bridge's Llama 3.1 provider carries.
LLAMA31_MEGATRON = {"rotary_base": 500000, "rotary_percent": 1.0, "rope_scaling": True, "rope_scaling_factor": 8.0}


def _hf(hf):
    facts = hf_rope(hf)
    return canonical_rope(facts["rope_theta"], facts["partial_rotary_factor"], facts["rope_scaling"])


def _megatron(facts):
    scaling = megatron_scaling(
        facts.get("rope_scaling"), facts.get("rope_scaling_factor"), facts.get("seq_len_interpolation_factor")
    )
    return canonical_rope(facts["rotary_base"], facts["rotary_percent"], scaling)


@pytest.mark.parametrize("hf", [LLAMA31_HF, LLAMA31_HF_V5])
def test_llama31_scaling_is_the_same_on_both_sides(hf):
    rollout, training = _hf(hf), _megatron(LLAMA31_MEGATRON)
    assert rollout[0] == training[0] == "llama3"
    assert same_value(rollout[1], training[1])


def test_plain_rope_has_no_scaling_entry_on_either_side():
    plain_hf = _hf(SimpleNamespace(rope_theta=1000000, rope_scaling=None))
    plain_v5 = _hf(SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    plain_megatron = _megatron({"rotary_base": 1000000, "rotary_percent": 1.0})
    assert plain_hf == plain_v5 == plain_megatron == ("default", {"theta": 1e6, "partial_rotary_factor": 1.0})


def test_a_real_difference_stays_a_difference():
    other_factor = _megatron({**LLAMA31_MEGATRON, "rope_scaling_factor": 32.0})
    assert not same_value(_hf(LLAMA31_HF)[1], other_factor[1])
    linear = _megatron({"rotary_base": 10000, "rotary_percent": 1.0, "seq_len_interpolation_factor": 4.0})
    assert linear == ("linear", {"theta": 10000.0, "partial_rotary_factor": 1.0, "scaling": {"factor": 4.0}})
