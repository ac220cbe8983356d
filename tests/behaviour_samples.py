"""Behaviour fingerprint values (``vocab.behaviour``) for the contract and binding tests: samples
built the way the hooks build them (``per_layer``), and hypothesis strategies of valid values."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from nemo_rl_attn_align.vocab.behaviour import ROPE_POSITIONS, SINKS, mask, per_layer, rope, softmax


def rope_kind(rates: list[float], head_dim: int, *, interleaved: bool = False, scale: float = 1.0) -> dict:
    """One rope kind rotating pair ``i`` by ``rates[i]`` radians per position (fp32, wrapped)."""
    n = len(rates)
    pairs = [[2 * i, 2 * i + 1] for i in range(n)] if interleaved else [[i, i + n] for i in range(n)]
    angles = [[math.remainder(p * rate, 2 * math.pi) for rate in rates] for p in ROPE_POSITIONS]
    return {"head_dim": head_dim, "pairs": pairs, "angles": angles, "scales": [scale] * n}


def default_rates(rotary_dim: int, theta: float) -> list[float]:
    """Default RoPE's inverse frequencies for ``rotary_dim`` channels."""
    return [theta ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)]


def rope_value(kinds_by_layer: dict[int, dict]) -> dict:
    """A checked ``rope`` value of layer -> kind, at every position."""
    return rope({"positions": list(ROPE_POSITIONS), **per_layer(kinds_by_layer)}, "sample rope")


ROPE = rope_value({0: rope_kind(default_rates(8, 1e6), 8), 1: rope_kind(default_rates(8, 1e6), 8)})
ROPE_INTERLEAVED = rope_value(
    {0: rope_kind(default_rates(8, 1e6), 8, interleaved=True), 1: rope_kind(default_rates(8, 1e6), 8, interleaved=True)}
)
MASK = mask(per_layer({0: {"causal": True, "window": None}, 1: {"causal": True, "window": None}}), "sample mask")
MASK_WINDOWED = mask(per_layer({0: {"causal": True, "window": 4095}, 1: {"causal": True, "window": None}}), "sample")
SOFTMAX = softmax(
    per_layer(
        {
            0: {"scale": 0.0883883461356163, "softcap": None, "sinks": "none"},
            1: {"scale": 0.0883883461356163, "softcap": None, "sinks": "none"},
        }
    ),
    "sample softmax",
)
SOFTMAX_SOFTCAP = softmax(
    per_layer(
        {
            0: {"scale": 0.0883883461356163, "softcap": 50.0, "sinks": "none"},
            1: {"scale": 0.0883883461356163, "softcap": 50.0, "sinks": "none"},
        }
    ),
    "sample softmax",
)

_layers = st.lists(st.integers(0, 64), min_size=1, max_size=4, unique=True)


def rope_strategy():
    """Valid ``rope`` values: a few layers, default or interleaved pairs, any theta."""
    kinds = st.builds(
        lambda dim, theta, inter, scale: rope_kind(default_rates(dim, theta), dim, interleaved=inter, scale=scale),
        st.sampled_from((2, 4, 8)),
        st.floats(2.0, 1e7),
        st.booleans(),
        st.floats(0.5, 2.0, width=32),
    )
    return st.builds(lambda layers, kind: rope_value(dict.fromkeys(layers, kind)), _layers, kinds)


def mask_strategy():
    kinds = st.fixed_dictionaries({"causal": st.booleans(), "window": st.one_of(st.none(), st.integers(0, 2**31))})
    return st.builds(lambda layers, kind: mask(per_layer(dict.fromkeys(layers, kind)), "m"), _layers, kinds)


def softmax_strategy():
    kinds = st.fixed_dictionaries(
        {
            "scale": st.floats(0.0009765625, 1.0, width=32),
            "softcap": st.one_of(st.none(), st.floats(1.0, 100.0, width=32)),
            "sinks": st.sampled_from(SINKS),
        }
    )
    return st.builds(lambda layers, kind: softmax(per_layer(dict.fromkeys(layers, kind)), "s"), _layers, kinds)
