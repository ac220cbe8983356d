"""The training side on the real megatron-core (tiny GPTModel, CPU): two builds that differ in one
named operator or attention knob are told apart at that operator and layer, an aligned pair agrees
everywhere with attention adding 0, and the CLI runs each side in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nemo_rl_attn_align.probe import divergence, megatron_side, render, replay
from nemo_rl_attn_align.probe.sides import SideSpec
from nemo_rl_attn_align.vocab.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference():
    return megatron_side.capture(SideSpec("training"))


def test_the_capture_holds_every_layer_in_the_tokens_first_layout(reference):
    tokens = sum(len(s) for s in reference.sequences)
    assert len(reference.layers) == megatron_side.TINY["num_layers"]
    heads, groups = megatron_side.TINY["num_attention_heads"], megatron_side.TINY["num_query_groups"]
    head_dim = megatron_side.TINY["hidden_size"] // heads
    layer = reference.layers[0]
    assert layer["query"].shape == (tokens, heads, head_dim) and layer["key"].shape == (tokens, groups, head_dim)
    assert layer["after_mlp"].shape == (tokens, megatron_side.TINY["hidden_size"])
    assert reference.logprobs.shape == (tokens - len(reference.sequences),) and (reference.logprobs < 0).all()


def test_an_aligned_pair_agrees_and_attention_adds_zero_at_every_layer(reference):
    other = megatron_side.capture(SideSpec("rollout"), reference)
    result = divergence.compare(reference, other)
    assert result.first is None
    assert [row.attention_share.max_abs for row in result.layers] == [0.0] * len(result.layers)
    assert result.token_mult_prob_error == pytest.approx(1.0, abs=1e-7)
    assert render.verdict(result).startswith("attention adds 0 at every layer")


@pytest.mark.parametrize(
    ("knob", "stage", "attention_adds"),
    [
        ({"softmax_scale": 0.1}, "attention", True),  # an attention knob: the softmax scale
        ({"rotary_interleaved": True}, "rope", False),  # RoPE's pairing of channels
        ({"layernorm_epsilon": 1e-2}, "qkv", False),  # the input norm
    ],
)
def test_one_differing_operator_is_named_as_the_first_divergence(reference, knob, stage, attention_adds):
    other = megatron_side.capture(SideSpec("rollout", model=knob), reference)
    result = divergence.compare(reference, other)
    assert result.first is not None and (result.first.layer, result.first.stage) == (0, stage)
    shares = [row.attention_share.max_abs for row in result.layers]
    assert all(s > 0 for s in shares) if attention_adds else shares == [0.0] * len(shares)
    assert result.token_mult_prob_error > 1.0
    assert f"{divergence.STAGES[stage][1]} at layer 0" in render.verdict(result)


@pytest.mark.parametrize("knob", [{}, {"softmax_scale": 0.1}, {"softmax_scale": 0.5, "rotary_interleaved": True}])
def test_the_replay_estimate_equals_the_measured_share_where_the_replay_is_exact(reference, knob):
    """megatron-local replays Megatron's local DotProductAttention exactly on CPU: both figures agree bit for bit."""
    result = divergence.compare(reference, megatron_side.capture(SideSpec("rollout", model=knob), reference))
    assert result.replays == ("megatron-local", "megatron-local")
    for row in result.layers:
        assert row.replay_estimate == row.attention_share
    assert (max(row.attention_share.max_abs for row in result.layers) > 0) == ("softmax_scale" in knob)


@pytest.mark.parametrize(
    ("knob", "rope_adds"),
    [({}, False), ({"softmax_scale": 0.1}, False), ({"rotary_interleaved": True}, True), ({"rotary_base": 5000}, True)],
)
def test_ropes_measured_share_is_what_this_sides_rope_adds_on_the_references_qkv(reference, knob, rope_adds):
    """RoPE run on the reference's QKV output: 0 for an aligned pair and an attention knob (even at layer 1,
    where the inputs already differ); for a RoPE knob, at layer 0 (inputs equal) exactly the rope stage's diff."""
    result = divergence.compare(reference, megatron_side.capture(SideSpec("rollout", model=knob), reference))
    shares = [row.rope_share.max_abs for row in result.layers]
    if rope_adds:
        assert all(s > 0 for s in shares) and result.layers[0].rope_share == result.layers[0].stages["rope"]
        assert "RoPE on the same inputs adds up to" in render.verdict(result)
    else:
        assert shares == [0.0] * len(shares) and "RoPE on the same inputs adds 0" in render.verdict(result)


def test_the_qkv_layouts_convert_both_ways():
    mixed = torch.randn(5, 2 * (2 + 2) * 8)  # 2 query groups of 2 queries, one key and one value each, head dim 8
    flat = megatron_side._unpacked_qkv(mixed, heads=4, groups=2)
    assert torch.equal(megatron_side._packed_qkv(flat, heads=4, groups=2), mixed)


def test_the_megatron_local_replay_reproduces_the_captured_attention(reference):
    for layer in range(len(reference.layers)):
        replayed = replay.attention(reference, layer, "megatron-local", None)
        assert torch.equal(replayed, reference.layers[layer]["attention"])


def test_a_differing_later_layer_is_named_by_its_index(reference):
    """Only layer 1's weights differ (another seed for its QKV projection): the first divergence is there."""
    model = megatron_side.build(SideSpec("rollout"))
    torch.manual_seed(1)
    with torch.no_grad():
        model.decoder.layers[1].self_attention.linear_qkv.weight.add_(
            torch.randn_like(model.decoder.layers[1].self_attention.linear_qkv.weight) * 1e-3
        )
    other = megatron_side.capture_model(model, SideSpec("rollout"), reference)
    result = divergence.compare(reference, other)
    assert (result.first.layer, result.first.stage) == (1, "qkv")


def _probe(tmp_path, rollout: str, *extra: str):
    (tmp_path / "train.json").write_text("{}")
    (tmp_path / "rollout.json").write_text(rollout)
    sides = [str(tmp_path / "train.json"), str(tmp_path / "rollout.json")]
    command = [sys.executable, "-m", "nemo_rl_attn_align", "probe", *sides, *extra]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)


def test_the_cli_runs_each_side_in_its_own_process(tmp_path):
    (tmp_path / "prompts.json").write_text("[[3, 9, 27, 81], [2, 4, 8]]")
    extra = ["--json", "--prompts", str(tmp_path / "prompts.json"), "--out", str(tmp_path / "keep")]
    pytest.importorskip("matplotlib")
    extra += ["--plot", str(tmp_path / "probe.png")]
    done = _probe(tmp_path, '{"model": {"rotary_interleaved": true}}', *extra)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == f"plot: {tmp_path / 'probe.png'}"  # stdout stays one JSON object
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(done.stdout)
    assert data["first_divergence"]["stage"] == "rope" and data["first_divergence"]["layer"] == 0
    assert data["verdict"].startswith("attention adds 0 at every layer; the first difference is RoPE at layer 0")
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == [
        "plugin",
        "rollout.capture.pt",
        "rollout.side.json",
        "train.capture.pt",
        "train.side.json",
    ]


@pytest.mark.parametrize(
    ("side", "message"),
    [
        ('{"engine": "sglang"}', "engine='sglang' cannot be probed yet"),
        ('{"modle": {}}', "key 'modle' is not a side setting"),
        ("[1]", "a side file is a JSON object"),
        ('{"replay": "flash-3"}', "replay='flash-3': unknown engine"),
        ('{"model": {"no_such_field": 1}}', "side rollout"),
        ('{"engine": "megatron-bridge"}', "model.checkpoint=None is not a Hugging Face checkpoint directory"),
    ],
)
def test_bad_side_files_are_one_line_and_exit_2(tmp_path, side, message):
    done = _probe(tmp_path, side)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_qkv_capture_is_queries_then_keys_then_values(reference):
    """Without RoPE's rotation (position 0 of each sequence) the unpacked QKV equals q, k, v after RoPE."""
    layer = reference.layers[0]
    start = [0, len(reference.sequences[0])]
    q, k, v = (layer[n][start].flatten(1) for n in ("query", "key", "value"))
    assert torch.equal(layer["qkv"][start], torch.cat([q, k, v], dim=-1))


def test_building_a_side_leaves_the_nvte_environment_as_it_was(monkeypatch):
    """Megatron sets NVTE_* while it builds; a value left by someone else neither stops the probe nor changes."""
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    monkeypatch.delenv("NVTE_FUSED_ATTN", raising=False)
    megatron_side.build(SideSpec("training"))
    assert os.environ.get("NVTE_FLASH_ATTN") == "1" and "NVTE_FUSED_ATTN" not in os.environ


def test_a_megatron_bridge_side_file_names_a_checkpoint_and_a_precision_nemo_rl_takes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    side = tmp_path / "train.json"
    model = {"checkpoint": str(tmp_path)}
    side.write_text(json.dumps({"engine": "megatron-bridge", "model": model}))
    assert SideSpec.read(side).settings()["replay"] == "megatron-local"
    side.write_text(json.dumps({"engine": "megatron-bridge", "model": {**model, "precision": "fp8"}}))
    with pytest.raises(UsageError, match=r"model.precision='fp8': use one of float32, bfloat16, float16"):
        SideSpec.read(side)
    side.write_text(json.dumps({"engine": "megatron-bridge", "model": {**model, "hf_config_overrides": [1]}}))
    with pytest.raises(UsageError, match=r"model.hf_config_overrides=\[1\] is not an object; give the Hugging Face"):
        SideSpec.read(side)
    side.write_text(json.dumps({"engine": "megatron-bridge", "model": {"checkpoint": "Qwen/Qwen2.5-1.5B"}}))
    assert SideSpec.read(side).model["checkpoint"] == "Qwen/Qwen2.5-1.5B"  # a hub id, as policy.model_name
    for wrong in (str(tmp_path / "missing"), "no-slash", str(tmp_path / "train.json")):
        side.write_text(json.dumps({"engine": "megatron-bridge", "model": {"checkpoint": wrong}}))
        with pytest.raises(
            UsageError, match=r"is not a Hugging Face checkpoint directory \(no config.json\) or hub id"
        ):
            SideSpec.read(side)


def test_the_capture_names_what_was_replaced_to_run_on_this_machine(reference):
    assert reference.settings["substitutions"] == ([] if torch.cuda.is_available() else list(megatron_side.CPU_ONLY))
    result = divergence.compare(reference, reference)
    assert result.substitutions == {"training": reference.settings["substitutions"]}
    if not torch.cuda.is_available():
        assert render.table(result).splitlines()[-1] == "training ran with: " + "; ".join(megatron_side.CPU_ONLY)
