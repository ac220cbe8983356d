"""Materializers differ from the reference where the engine does, and equal it in canonical order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_rl_attn_align.reference import kernels  # noqa: E402
from nemo_rl_attn_align.reference.attention import reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.causal import Causal  # noqa: E402
from nemo_rl_attn_align.reference.materializers import ENGINES, parse_materializer  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, assert_same_bits, make_qkv  # noqa: E402

ENGINE_SPECS = [
    "flash",
    "flash:tile=16",
    "flash:splits=3,tile=16",
    "te-p2p:cp=1",
    "te-p2p:cp=2",
    "te-p2p:cp=4",
    "te-p2p-bshd:cp=2",
    "te-allgather:cp=2",
    "vllm:chunk=24,page=16,tile=16",
    "vllm:chunk=1,page=8,splits=3,tile=16",
    "vllm:chunk=24,cascade=40,tile=16",
    "vllm-fa3:chunk=24,tile=16",
    "vllm-fa3:chunk=24,splits=3,tile=16",
    "vllm-fa3:chunk=24,cascade=40,tile=16",
    "megatron-local",
    "hf-eager",
]


def run(spec, dtype, window=None, seq=128):
    q, k, v = make_qkv(dtype, seq_q=seq, head_dim=32)
    return parse_materializer(spec)(q, k, v, window=window, spec=SPEC), reference_attention(
        q, k, v, Causal(window), spec=SPEC
    )


@pytest.mark.parametrize("spec", ENGINE_SPECS)
def test_engine_order_differs_from_reference_in_bf16(spec):
    got, ref = run(spec, torch.bfloat16)
    assert not torch.equal(got[0], ref[0])
    assert (got[0].double() - ref[0].double()).abs().max() > 0


@pytest.mark.parametrize("spec", [*ENGINE_SPECS, "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_canonical_order_equals_reference(spec, dtype):
    canonical = spec + (",canonical=1" if ":" in spec else ":canonical=1")
    got, ref = run(canonical, dtype, window=None if "p2p" in spec or "cascade" in spec else 19)
    assert_same_bits(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_replays_agree_where_the_engines_do(dtype):
    """Decompositions that do not change a row's reduction give the same bits."""
    q, k, v = make_qkv(dtype, seq_q=128, head_dim=32)

    def call(spec, window=None):
        return parse_materializer(spec)(q, k, v, window=window)

    flash16 = call("flash:tile=16")
    assert_same_bits(call("te-p2p:cp=1,tile=16"), flash16)  # one ring step is one flash call
    assert_same_bits(call("te-allgather:cp=2,tile=16"), flash16)  # per-chunk calls, KV tiles from 0
    assert_same_bits(call("te-p2p-bshd:cp=1,tile=16"), flash16)
    assert_same_bits(call("vllm:chunk=500,tile=16"), flash16)  # one chunk is one call
    paged = call("vllm:chunk=20,page=16", 19)
    for page in (1, 5, 64):  # pages only relabel tokens
        assert_same_bits(call(f"vllm:chunk=20,page={page}", 19), paged)
    # vLLM's FA2 splits only decode: on prefill chunks the split count changes nothing ...
    assert_same_bits(call("vllm:chunk=20,splits=2,tile=16"), call("vllm:chunk=20,splits=1,tile=16"))
    # ... on one-token decode steps it does; FA3 splits prefill chunks too
    assert not torch.equal(call("vllm:chunk=1,splits=2,tile=16")[0], call("vllm:chunk=1,splits=1,tile=16")[0])
    assert not torch.equal(call("vllm-fa3:chunk=20,splits=2,tile=16")[0], call("vllm-fa3:chunk=20,splits=1,tile=16")[0])
    # the cascade merge is a real extra rounding
    assert not torch.equal(call("vllm:chunk=20,cascade=40,tile=16")[0], call("vllm:chunk=20,tile=16")[0])


def test_te_lse_merge_is_logaddexp():
    a, b = torch.randn(1000) * 5, torch.randn(1000) * 5
    assert torch.allclose(kernels.te_lse_merge(a, b), torch.logaddexp(a, b), atol=1e-6)


def test_kernel_tiles_follow_flash_attention():
    assert (kernels.split_kv_tile(64), kernels.split_kv_tile(128), kernels.split_kv_tile(256)) == (256, 128, 64)
    assert [kernels.forward_tile(d) for d in (32, 64, 96, 128, 256)] == [128, 128, 64, 64, 64]
    assert [kernels.fa3_tile(d) for d in (64, 128, 192, 256)] == [128, 128, 96, 80]


def test_split_heuristics_follow_flash_attention():
    # FA2 mha_fwd: a full grid never splits; one sequence of 8 heads x 1 row block on 2*132 "SMs" does
    assert kernels.fa2_num_splits(32 * 16, 264, 16) == 1
    assert kernels.fa2_num_splits(8, 264, 16) == 16  # 8 * 16 / 264 = 0.48 waves, best below 17
    # 64 blocks: 12 splits of ceil(64/12) = 6 blocks are really 11 (ineligible), so the best is 11 and
    # 85% of it picks 10 (9 is ineligible too); counting 12 would have picked 11
    assert kernels.fa2_num_splits(1, 264, 64, max_splits=12) == 10
    assert kernels.fa3_num_splits(1, 264, 64, max_splits=12) == 11
    assert kernels.fa3_num_splits(8, 132, 4) == 1  # FA3: never for <= 4 KV tiles
    assert kernels.fa3_num_splits(8, 132, 64) == 15  # 33 splits fill 2 waves exactly; 15 is 91%


def test_flash_dense_call_uses_the_heuristic():
    """``flash:splits=0`` is dense ``mha_fwd``: a 2-head, 128-row call on an H100 gets split."""
    q, k, v = make_qkv(torch.bfloat16, seq_q=128, heads=2, kv_heads=1, head_dim=32)
    chosen = kernels.fa2_num_splits(2 * 2, 2 * kernels.NUM_SMS["sm90"], 1)
    assert chosen == 1  # 128 keys are one 128-token split tile
    assert_same_bits(
        parse_materializer("flash:splits=0")(q, k, v), parse_materializer("flash:splits=1,tile=128")(q, k, v)
    )


def test_thd_correction_is_te_kernel_read_element_by_element():
    """``te_out_correction`` against a scalar transcription of ``thd_out_correction_kernel``:
    ``p = (dtype)(p + (p_step == 0 ? 0 : (dtype)(float(p_step) * expf(lse_step - lse))))``, and of
    bshd's ``out.add_(out_step * exp(lse_step - lse))`` (one rounding), on a small hand-sized case."""
    from nemo_rl_attn_align.reference.replays import te_out_correction

    gen = torch.Generator().manual_seed(5)
    dtype = torch.bfloat16
    o = [torch.randn(4, 1, 2, generator=gen).to(dtype) for _ in range(3)]
    o[1][0, 0, 0] = 0.0
    lse_steps = [torch.randn(4, 1, generator=gen) for _ in range(3)]
    lse = lse_steps[0].clone()
    for s in lse_steps[1:]:
        lse = kernels.te_lse_merge(lse, s)
    steps = [(slice(None), o[i], lse_steps[i]) for i in range(3)]

    def bf16(x):
        return float(torch.tensor(x, dtype=torch.float32).to(dtype))

    def f32(x):
        return float(torch.tensor(x, dtype=torch.float32))

    thd, bshd = te_out_correction(steps, lse, 4, dtype, True), te_out_correction(steps, lse, 4, dtype, False)
    for t in range(4):
        for d in range(2):
            p_thd = 0.0
            p_bshd = None
            for i in range(3):
                e = f32(torch.exp(lse_steps[i][t, 0] - lse[t, 0]))
                step = float(o[i][t, 0, d])
                p_thd = bf16(p_thd + (0.0 if step == 0 else bf16(f32(step * e))))
                p_bshd = bf16(f32(step * e)) if p_bshd is None else bf16(p_bshd + f32(step * e))
            assert float(thd[t, 0, d]) == p_thd and float(bshd[t, 0, d]) == p_bshd
    # a hand-checked element: 1 + 2**-8 is a tie in bf16 (spacing 2**-7 at 1), rounding to even 1.0
    # in thd's (dtype) product before the add; bshd adds the unrounded FP32 product 2**-8 + 2**-20
    ones = [
        (slice(None), torch.tensor([[[1.0]]], dtype=dtype), torch.zeros(1, 1)),
        (slice(None), torch.tensor([[[2.0**-8 + 2.0**-20]]], dtype=torch.float32).to(dtype), torch.zeros(1, 1)),
    ]
    merged = torch.zeros(1, 1)  # exp(0 - 0) = 1: products are the outs
    assert float(ones[1][1]) == 2.0**-8  # bf16 cannot hold the 2**-20
    assert float(te_out_correction(ones, merged, 1, dtype, True)) == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_thd_ring_differs_from_bshd_and_drifts_more(dtype):
    q, k, v = make_qkv(dtype, seq_q=256, head_dim=32)
    ref = reference_attention(q, k, v, spec=SPEC)
    thd = parse_materializer("te-p2p:cp=2")(q, k, v)
    bshd = parse_materializer("te-p2p-bshd:cp=2")(q, k, v)
    assert torch.equal(thd[1], bshd[1])  # same LSE merge
    differ = (thd[0] != bshd[0]).float().mean()
    assert differ > 0.05
    err_thd = (thd[0].double() - ref[0].double()).abs().mean()
    err_bshd = (bshd[0].double() - ref[0].double()).abs().mean()
    assert err_thd > err_bshd


def test_te_fused_is_not_replayable():
    from nemo_rl_attn_align.reference.materializers import NotReplayable

    q, k, v = make_qkv(torch.bfloat16, seq_q=32)
    with pytest.raises(NotReplayable, match="not public"):
        parse_materializer("te-fused")(q, k, v)
    assert not ENGINES["te-fused"].replayable and ENGINES["te-p2p"].replayable


def test_every_engine_names_what_it_replays():
    for name, engine in ENGINES.items():
        assert engine.replays and set(engine.gpus) <= {"sm80", "sm90"} and engine.dtypes, name
    assert ENGINES["vllm-fa3"].gpus == ("sm90",) and ENGINES["vllm"].gpus == ("sm80",)
    assert "fp32" not in ENGINES["flash"].dtypes and "fp32" in ENGINES["megatron-local"].dtypes


def test_te_p2p_needs_divisible_length_and_no_window():
    q, k, v = make_qkv(torch.bfloat16, seq_q=30)
    with pytest.raises(ValueError, match="divisible by 2\\*cp=8"):
        parse_materializer("te-p2p:cp=4")(q, k, v)
    q, k, v = make_qkv(torch.bfloat16, seq_q=32)
    with pytest.raises(ValueError, match="sliding-window"):
        parse_materializer("te-p2p:cp=2")(q, k, v, window=4)


@pytest.mark.parametrize(
    "text, message",
    [
        ("nope", "unknown engine"),
        ("te-p2p:cp", "not key=integer"),
        ("te-p2p:chunk=3", "has no parameter"),
        ("vllm:chunk=0", "must be >= 1"),
        ("flash:gpu=75", "not one of"),
        ("vllm:splits=-1", "must be >= 0"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_materializer(text)


def test_parse_round_trip():
    m = parse_materializer("vllm:chunk=64,splits=4")
    assert m.name == "vllm:chunk=64,splits=4"
    assert m.options == {"chunk": 64, "page": 16, "splits": 4, "cascade": 0, "tile": 0}
    assert set(ENGINES) == {
        "reference",
        "flash",
        "te-p2p",
        "te-p2p-bshd",
        "te-allgather",
        "te-fused",
        "vllm",
        "vllm-fa3",
        "megatron-local",
        "hf-eager",
    }
