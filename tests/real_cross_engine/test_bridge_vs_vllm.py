"""``probe`` across engines on one checkpoint: the training side as NeMo-RL builds it
(Megatron-Bridge from the HF checkpoint, megatron-core's local layer spec on CPU, the CPU stand-in
for Transformer Engine) against a real vLLM CPU engine, both in float32, each in its own venv.

What holds (measured on 2 CPU cores, see docs/probe.md): the two engines agree at every stage to
float32 rounding (a few 1e-7: the RMSNorm and matmul kernels differ, nothing else), vLLM's
attention run on the training side's query/key/value adds about 1e-7, and
``token_mult_prob_error`` is 1 to 6 digits. So above ``ATOL`` the aligned pair agrees everywhere,
a RoPE base changed on the vLLM side (``hf_overrides``) is named at RoPE, layer 0, and a softmax
scale changed on the training side (a provider field) at core attention, layer 0, with vLLM's
attention then adding what the scale changed. In bfloat16 on both sides the difference is bf16
rounding, first seen at layer 0's QKV stage, attention's share a part of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_rl_attn_align.probe import capture, divergence, render, sides, te_stand_in
from tests.real_vllm.conftest import KV_CACHE_GIB

pytestmark = pytest.mark.real_cross_engine

#: Above float32 rounding across the two engines' kernels (measured: at most 5e-7), far below any knob's effect.
ATOL = 1e-5
ROLLOUT_ENGINE = {"dtype": "float32", "max_model_len": 128, "max_num_seqs": 2, "block_size": 32}
OTHER_ROPE = {"hf_overrides": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}}


@pytest.fixture(scope="module")
def probe(pythons, checkpoint, tmp_path_factory):
    """``probe(training, rollout)``: the Megatron-Bridge side with ``training`` over its model
    settings (captured once per setting), then vLLM with ``rollout`` over its engine arguments
    replaying it, compared at ``ATOL``."""
    workdir = tmp_path_factory.mktemp("probe")
    references: dict[str, tuple[capture.Capture, Path]] = {}
    runs = iter(range(100))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)

        def run(training: dict, rollout: dict) -> divergence.ProbeResult:
            key = json.dumps(training, sort_keys=True)
            if key not in references:
                model = {"checkpoint": str(checkpoint), **training}
                spec = sides.SideSpec(f"train-{len(references)}", "megatron-bridge", model, python=pythons[0])
                path = sides.run(spec, workdir)
                references[key] = capture.load(path), path
            reference, path = references[key]
            model = {"model": str(checkpoint), **ROLLOUT_ENGINE, **rollout}
            spec = sides.SideSpec(f"rollout-{next(runs)}", "vllm", model, python=pythons[1])
            return divergence.compare(reference, capture.load(sides.run(spec, workdir, path)), atol=ATOL)

        yield run


def _largest(result: divergence.ProbeResult, stage: str) -> float:
    return max(row.stages[stage].max_abs for row in result.layers)


def test_megatron_bridge_and_vllm_on_one_checkpoint_agree_and_attention_adds_next_to_nothing(probe):
    result = probe({}, {})
    print("\n" + render.verdict(result) + "\n" + render.table(result))
    assert result.first is None, render.table(result)
    assert all(0 < _largest(result, stage) < ATOL for stage in ("qkv", "rope", "attention", "after_mlp"))
    assert [row.attention_share.max_abs < 1e-6 for row in result.layers] == [True] * len(result.layers)
    assert result.logprobs.max_abs < ATOL
    assert result.token_mult_prob_error == pytest.approx(1.0, abs=1e-6)
    assert result.gen_kl_error < 1e-9
    named = result.substitutions[result.reference]
    assert named[0] == te_stand_in.NAME and "transformer_layer_spec: local_layer_spec" in named[1]
    assert "apply_rope_fusion: False (was True)" in named and result.substitutions[result.other] == []
    assert f"{result.reference} ran with: {te_stand_in.NAME}" in render.table(result)


def test_a_rope_base_changed_on_the_vllm_side_is_named_at_rope_layer_0(probe):
    result = probe({}, OTHER_ROPE)
    assert result.first is not None and (result.first.layer, result.first.stage) == (0, "rope")
    assert result.first.difference.max_abs > 0.1
    assert result.layers[0].stages["qkv"].max_abs < ATOL
    assert [row.attention_share.max_abs < 1e-6 for row in result.layers] == [True] * len(result.layers)
    assert result.token_mult_prob_error > 1.0001
    assert render.verdict(result).startswith("attention adds 0 at every layer; the first difference is RoPE at layer 0")


def test_a_softmax_scale_changed_on_the_training_side_is_named_at_core_attention_layer_0(probe):
    result = probe({"softmax_scale": 0.1}, {})
    assert result.first is not None and (result.first.layer, result.first.stage) == (0, "attention")
    assert result.layers[0].stages["rope"].max_abs < ATOL
    share = result.layers[0].attention_share.max_abs
    assert share == pytest.approx(result.first.difference.max_abs, rel=1e-3)
    assert render.verdict(result).startswith("attention at layer")


def test_an_unknown_provider_field_is_one_line_naming_it(pythons, checkpoint, tmp_path):
    model = {"checkpoint": str(checkpoint), "rope_base": 1.0}
    message = r"side bad .* exit 2: error: model.rope_base=1.0: GPTModelProvider has no field 'rope_base'"
    with pytest.raises(sides.UsageError, match=message):
        sides.run(sides.SideSpec("bad", "megatron-bridge", model, python=pythons[0]), tmp_path)


def test_in_bfloat16_the_engines_differ_by_bf16_rounding_and_attention_adds_part_of_it(probe):
    """NeMo-RL's ``precision: bfloat16`` (a ``Float16Module`` around the model, as in training)
    against vLLM's ``dtype: bfloat16``: the first difference is bf16 rounding at layer 0's input
    norm or QKV projection, and vLLM's attention on megatron's own q/k/v adds a part of it."""
    result = probe({"precision": "bfloat16"}, {"dtype": "bfloat16"})
    assert result.first is not None and (result.first.layer, result.first.stage) == (0, "qkv")
    assert all(_largest(result, stage) < 0.05 for stage in ("qkv", "rope", "attention", "after_mlp"))
    shares = [row.attention_share.max_abs for row in result.layers]
    assert 0 < max(shares) < 0.02
    assert 1.0 < result.token_mult_prob_error < 1.005
