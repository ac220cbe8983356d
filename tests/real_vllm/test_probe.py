"""``probe`` on the real vLLM CPU engine: two engines on one tiny Qwen3 checkpoint, each in its own
process, compared layer by layer. An aligned pair agrees everywhere with vLLM's attention adding 0
on the reference's inputs; a pair differing only in RoPE's base is named at RoPE, layer 0, and
vLLM's attention run on the reference's query/key/value still adds 0 (the inputs were replaced), while
its RoPE run on the reference's QKV output adds exactly the RoPE stage's difference at layer 0."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.probe import capture, divergence, render, sides
from tests.real_vllm.conftest import KV_CACHE_GIB

pytestmark = pytest.mark.real_vllm

ENGINE = {"dtype": "float32", "max_model_len": 128, "max_num_seqs": 2, "block_size": 32}
OTHER_ROPE = {"hf_overrides": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}


@pytest.fixture(scope="module")
def probe(models, tmp_path_factory, monkeypatch_module):
    """``probe(name, engine_args)``: that side's capture, replaying the reference engine's inputs."""
    monkeypatch_module.setenv("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    workdir = tmp_path_factory.mktemp("probe")
    model = {"model": str(models["qwen3"]), **ENGINE}
    reference_file = sides.run(sides.SideSpec("reference", engine="vllm", model=model), workdir)
    reference = capture.load(reference_file)

    def run(name: str, extra: dict) -> divergence.ProbeResult:
        spec = sides.SideSpec(name, engine="vllm", model={**model, **extra})
        return divergence.compare(reference, capture.load(sides.run(spec, workdir, reference=reference_file)))

    return run


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_an_aligned_pair_of_engines_agrees_and_attention_adds_zero(probe):
    result = probe("aligned", {})
    assert result.first is None
    assert [row.attention_share.max_abs for row in result.layers] == [0.0] * len(result.layers)
    assert [row.rope_share.max_abs for row in result.layers] == [0.0] * len(result.layers)
    assert result.token_mult_prob_error == pytest.approx(1.0, abs=1e-7)


def test_an_engine_with_another_rope_base_is_named_at_rope_layer_0(probe):
    result = probe("rope-base", OTHER_ROPE)
    assert result.first is not None and (result.first.layer, result.first.stage) == (0, "rope")
    assert result.layers[0].stages["qkv"].max_abs == 0
    assert [row.attention_share.max_abs for row in result.layers] == [0.0] * len(result.layers)
    assert result.layers[0].rope_share == result.layers[0].stages["rope"]  # RoPE alone, on equal inputs
    assert all(row.rope_share.max_abs > 0 for row in result.layers)
    assert result.token_mult_prob_error > 1.0
    assert render.verdict(result).startswith("attention adds 0 at every layer; the first difference is RoPE at layer 0")
