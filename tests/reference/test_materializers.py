"""Materializers differ from the reference where the engine does, and equal it in canonical order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.reference import kernels  # noqa: E402
from nemo_rl_attn_align.reference.attention import reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.materializers import ENGINES, parse_materializer  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, assert_same_bits, make_qkv  # noqa: E402

ENGINE_SPECS = [
    "flash", "flash:tile=16", "flash-splitkv:splits=3,tile=16", "te-p2p:cp=1", "te-p2p:cp=2", "te-p2p:cp=4",
    "te-allgather:cp=2", "vllm:chunk=24,page=16,tile=16", "vllm:chunk=24,page=8,splits=3,tile=16", "plain",
]


def run(spec, dtype, window=None, seq=128):
    q, k, v = make_qkv(dtype, seq_q=seq, head_dim=32)
    return parse_materializer(spec)(q, k, v, window=window, spec=SPEC), reference_attention(q, k, v, window=window, spec=SPEC)


@pytest.mark.parametrize("spec", ENGINE_SPECS)
def test_engine_order_differs_from_reference_in_bf16(spec):
    got, ref = run(spec, torch.bfloat16)
    assert not torch.equal(got[0], ref[0])
    assert (got[0].double() - ref[0].double()).abs().max() > 0


@pytest.mark.parametrize("spec", ENGINE_SPECS + ["reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_canonical_order_equals_reference(spec, dtype):
    canonical = spec + (",canonical=1" if ":" in spec else ":canonical=1")
    got, ref = run(canonical, dtype, window=None if "p2p" in spec else 19)
    assert_same_bits(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_replays_agree_where_the_engines_do(dtype):
    """Decompositions that do not change a row's reduction give the same bits."""
    q, k, v = make_qkv(dtype, seq_q=128, head_dim=32)

    def call(spec, window=None):
        return parse_materializer(spec)(q, k, v, window=window)

    flash16 = call("flash:tile=16")
    assert_same_bits(call("te-p2p:cp=1,tile=16"), flash16)           # one ring step is one flash call
    assert_same_bits(call("te-allgather:cp=2,tile=16"), flash16)     # per-chunk calls, KV tiles from 0
    assert_same_bits(call("flash-splitkv:splits=1,tile=16"), flash16)
    assert_same_bits(call("vllm:chunk=500,tile=16"), flash16)         # one chunk is one call
    paged = call("vllm:chunk=20,page=16,splits=2", 19)
    for page in (1, 5, 64):                                            # pages only relabel tokens
        assert_same_bits(call(f"vllm:chunk=20,page={page},splits=2", 19), paged)
    assert not torch.equal(call("vllm:chunk=20,splits=2,tile=16")[0], call("vllm:chunk=20,splits=1,tile=16")[0])


def test_te_lse_merge_is_logaddexp():
    a, b = torch.randn(1000) * 5, torch.randn(1000) * 5
    assert torch.allclose(kernels.te_lse_merge(a, b), torch.logaddexp(a, b), atol=1e-6)


def test_kernel_tiles_follow_flash_attention():
    assert (kernels.split_kv_tile(64), kernels.split_kv_tile(128), kernels.split_kv_tile(256)) == (256, 128, 64)
    assert kernels.FORWARD_TILE == 64


def test_te_p2p_needs_divisible_length_and_no_window():
    q, k, v = make_qkv(torch.bfloat16, seq_q=30)
    with pytest.raises(ValueError, match="divisible by 2\\*cp=8"):
        parse_materializer("te-p2p:cp=4")(q, k, v)
    q, k, v = make_qkv(torch.bfloat16, seq_q=32)
    with pytest.raises(ValueError, match="sliding-window"):
        parse_materializer("te-p2p:cp=2")(q, k, v, window=4)


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown engine"), ("te-p2p:cp", "not key=integer"), ("te-p2p:chunk=3", "has no parameter"),
    ("vllm:chunk=0", "must be >= 1"),
])
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_materializer(text)


def test_parse_round_trip():
    m = parse_materializer("vllm:chunk=64,splits=4")
    assert m.name == "vllm:chunk=64,splits=4" and m.options == {"chunk": 64, "page": 16, "splits": 4, "tile": 0}
    assert set(ENGINES) == {"reference", "flash", "flash-splitkv", "te-p2p", "te-allgather", "vllm", "plain"}
