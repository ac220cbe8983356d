"""``hosts.behaviour_probe``: the rope kind of a rotation, measured by evaluating it on basis vectors."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_rl_attn_align.hosts.behaviour_probe import NotARotation, no_rotation, rope_value, rotation_kind
from nemo_rl_attn_align.vocab.behaviour import ROPE_POSITIONS
from tests.behaviour_samples import default_rates, rope_kind


def _rotary(rates: list[float], *, interleaved: bool = False, scale: float = 1.0):
    """A reference rotary of the first ``2 * len(rates)`` channels (rotate_half style), as ``Apply``."""
    inv_freq = torch.tensor(rates, dtype=torch.float32)

    def apply(basis: torch.Tensor, positions) -> torch.Tensor:
        angles = torch.tensor(positions, dtype=torch.float32)[:, None] * inv_freq  # [P, n]
        angles = angles.repeat_interleave(2, -1) if interleaved else torch.cat([angles, angles], -1)
        rot = angles.shape[-1]
        x, rest = basis[..., :rot], basis[..., rot:]
        if interleaved:
            half = torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)
        else:
            x1, x2 = x.chunk(2, -1)
            half = torch.cat([-x2, x1], -1)
        cos, sin = (f(angles)[:, None, :] * scale for f in (torch.cos, torch.sin))
        return torch.cat([x * cos + half * sin, rest], -1)

    return apply


@pytest.mark.parametrize("interleaved", [False, True])
def test_pairs_angles_and_scales_are_those_of_the_rotation(interleaved):
    rates = default_rates(8, 10000.0)
    kind = rotation_kind(_rotary(rates, interleaved=interleaved, scale=1.25), 8, ROPE_POSITIONS)
    expected = rope_kind(rates, 8, interleaved=interleaved, scale=1.25)
    assert kind["pairs"] == expected["pairs"]
    assert kind["scales"] == pytest.approx(expected["scales"], rel=1e-6)
    for row, want in zip(kind["angles"], expected["angles"], strict=True):
        assert [math.remainder(a - b, 2 * math.pi) for a, b in zip(row, want, strict=True)] == pytest.approx(
            [0.0] * 4, abs=1e-3
        )
    assert all(-math.pi < a <= math.pi for row in kind["angles"] for a in row)


def test_partial_rotary_leaves_the_other_channels_out_of_every_pair():
    kind = rotation_kind(_rotary(default_rates(4, 10000.0)), 8, (1, 61))
    assert kind["pairs"] == [[0, 2], [1, 3]]
    assert len(kind["angles"]) == 2 and kind["angles"][0][0] == pytest.approx(1.0)


def test_a_map_that_mixes_more_than_two_channels_is_not_a_rotation():
    def mixing(basis, positions):
        return basis + 0.5 * basis.roll(1, -1) + 0.5 * basis.roll(2, -1)

    with pytest.raises(NotARotation, match="channel 0 moves into"):
        rotation_kind(mixing, 4, (1,))


def test_a_value_of_rotating_and_nope_layers_passes_the_contract_check():
    positions = (1, 61)
    value = rope_value({0: rotation_kind(_rotary([1.0, 0.5]), 4, positions), 1: no_rotation(4, positions)}, positions)
    assert value["positions"] == [1, 61] and value["layers"] == [[0, 0], [1, 1]]
    assert value["kinds"][1]["pairs"] == []
