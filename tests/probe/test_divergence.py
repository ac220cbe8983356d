"""The probe's comparison core on synthetic captures: first divergence, attention's share, NeMo-RL's
metrics, the verdict, JSON, the plot, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nemo_rl_attn_align.probe import capture as capture_file
from nemo_rl_attn_align.probe import divergence, render
from nemo_rl_attn_align.vocab.errors import UsageError
from tests.probe.synthetic import capture, perturbed, with_replay


def test_identical_captures_agree_everywhere():
    ref = capture()
    other = with_replay(capture(side="rollout"), [layer["attention"].clone() for layer in ref.layers])
    result = divergence.compare(ref, other)
    assert result.first is None
    assert all(row.attention_share is not None and row.attention_share.max_abs == 0 for row in result.layers)
    assert result.token_mult_prob_error == pytest.approx(1.0, abs=1e-7) and result.gen_kl_error == 0
    assert render.verdict(result).startswith("attention adds 0 at every layer; the two sides agree")


@pytest.mark.parametrize(
    ("layer", "tensor", "stage"),
    [
        (0, "qkv", "qkv"),
        (0, "key", "rope"),
        (1, "attention", "attention"),
        (2, "after_mlp", "after_mlp"),
        (1, "after_attention", "after_attention"),
    ],
)
def test_the_first_divergence_names_the_stage_and_layer_perturbed(layer, tensor, stage):
    ref = capture()
    result = divergence.compare(ref, perturbed(ref, layer, tensor, 1e-3))
    assert result.first is not None and (result.first.layer, result.first.stage) == (layer, stage)
    assert result.first.difference.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert divergence.STAGES[stage][1] in render.verdict(result)


def test_atol_hides_differences_at_or_below_it():
    ref = capture()
    other = perturbed(ref, 1, "attention", 1e-6)
    assert divergence.compare(ref, other, atol=1e-5).first is None
    assert divergence.compare(ref, other, atol=1e-7).first is not None


def test_attention_share_is_the_replay_against_the_reference_attention():
    ref = capture()
    replayed = [layer["attention"].clone() for layer in ref.layers]
    replayed[2] = replayed[2] + 3e-3
    result = divergence.compare(ref, with_replay(perturbed(ref, 0, "query", 0.5), replayed))
    assert [row.attention_share.max_abs for row in result.layers] == pytest.approx([0, 0, 3e-3], abs=1e-6)
    words = render.verdict(result)
    assert "attention at layer 2 adds 0.003" in words and "RoPE at layer 0" in words


def test_without_a_replay_the_share_is_said_to_be_unmeasured():
    ref = capture()
    result = divergence.compare(ref, perturbed(ref, 0, "qkv", 1.0))
    assert all(row.attention_share is None and row.replay_estimate is None for row in result.layers)
    assert result.replays is None and "replays" not in render.verdict(result)
    assert "not measured" in render.verdict(result) and " - " not in render.table(result).splitlines()[0]


def test_layers_choose_rows_but_the_first_divergence_is_searched_from_layer_zero():
    ref = capture()
    result = divergence.compare(ref, perturbed(ref, 0, "key", 0.1), layers=[2])
    assert [row.layer for row in result.layers] == [2]
    assert (result.first.layer, result.first.stage) == (0, "rope")


def test_metrics_are_nemo_rls_formulas():
    train = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    gen = train + torch.tensor([0.1, -0.2, 0.0, 0.3])
    assert divergence.token_mult_prob_error(gen, train) == pytest.approx(
        (math.exp(0.1) + math.exp(0.2) + 1 + math.exp(0.3)) / 4, rel=1e-6
    )
    logr = [-0.1, 0.2, 0.0, -0.3]
    assert divergence.gen_kl_error(gen, train) == pytest.approx(sum(math.exp(x) - 1 - x for x in logr) / 4, rel=1e-5)


def test_json_round_trips_and_names_the_operator():
    ref = capture()
    result = divergence.compare(ref, perturbed(ref, 1, "qkv", 2.0))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["first_divergence"]["operator"] == "the input norm or QKV projection"
    assert data["first_divergence"]["layer"] == 1 and len(data["layers"]) == 3


def test_a_capture_round_trips_through_its_file(tmp_path):
    ref = capture()
    capture_file.save(ref, tmp_path / "c.pt")
    back = capture_file.load(tmp_path / "c.pt")
    assert divergence.compare(ref, back).first is None and back.sequences == ref.sequences


@pytest.mark.parametrize("content", [b"not a capture", None])
def test_a_bad_capture_file_is_one_line_naming_it(tmp_path, content):
    path = tmp_path / "bad.pt"
    if content is None:
        torch.save({"format": 99}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=r"bad\.pt") as err:
        capture_file.load(path)
    assert "\n" not in str(err.value)


def test_different_batches_or_depths_are_refused():
    ref = capture()
    other = capture(side="rollout", layers=2)
    with pytest.raises(UsageError, match="layers: training has 3, rollout 2"):
        divergence.compare(ref, other)
    shifted = capture_file.Capture("rollout", [[9, 9]], ref.layers, ref.logprobs)
    with pytest.raises(UsageError, match="different batches"):
        divergence.compare(ref, shifted)
    with pytest.raises(UsageError, match="layer 5 does not exist"):
        divergence.compare(ref, ref, layers=[5])


def test_the_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from nemo_rl_attn_align.probe.plot import plot

    ref = capture()
    plot(divergence.compare(ref, perturbed(ref, 1, "attention", 0.01)), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_labels_zero_marks_the_first_divergence_and_names_what_was_not_measured():
    pytest.importorskip("matplotlib")
    from nemo_rl_attn_align.probe.plot import NOT_MEASURED, figure

    ref = capture()
    fig = figure(divergence.compare(ref, perturbed(ref, 1, "attention", 0.01), atol=1e-6))
    where, adds = fig.axes
    assert where.get_yticklabels()[0].get_text() == "0"  # a difference of 0 has its own row
    assert where.get_ylim()[1] > 0.01 and where.get_ylim()[0] < 1e-6  # the data and --atol are in range
    assert any(t.get_text() == "first difference: core attention" for t in where.texts)
    legend = [t.get_text() for t in adds.get_legend().get_texts()]
    assert any(text.endswith(NOT_MEASURED) for text in legend)  # the synthetic other side replayed nothing
