"""The reference's bits do not depend on the execution plan: one test per axis, bf16 and fp16."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nemo_rl_attn_align.reference.attention import reference_attention  # noqa: E402
from nemo_rl_attn_align.reference.causal import Causal  # noqa: E402
from nemo_rl_attn_align.reference.plans import CP_COMMS, LAYOUTS, ChunkedPrefill, ContextParallel, SplitKV, cp_chunks  # noqa: E402
from tests.reference.conftest import DTYPES, SPEC, assert_same_bits, make_qkv  # noqa: E402

WINDOWS = [None, 23]


def ref(q, k, v, window, plan=None, **kw):
    return reference_attention(q, k, v, Causal(window, **kw), plan=plan, spec=SPEC)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_context_parallel_size_layout_and_comm(dtype, window):
    q, k, v = make_qkv(dtype)
    base = ref(q, k, v, window)
    for size in (1, 2, 4, 8):
        for layout in LAYOUTS:
            for comm in CP_COMMS:
                assert_same_bits(base, ref(q, k, v, window, ContextParallel(size, layout, comm)))


def test_load_balanced_layout_is_te_dual_chunk():
    # rank r holds chunks r and 2cp-1-r (TE get_seq_chunk_ids_for_reordering_before_attn)
    assert cp_chunks(16, 2, "load_balanced") == [[(0, 4), (12, 16)], [(4, 8), (8, 12)]]
    assert cp_chunks(10, 3, "contiguous") == [[(0, 4)], [(4, 7)], [(7, 10)]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_kv_splits_by_count_and_by_size(dtype, window):
    q, k, v = make_qkv(dtype)
    base = ref(q, k, v, window)
    for plan in [SplitKV(num_splits=n) for n in (1, 2, 3, 4, 7, 16)] + [
        SplitKV(split_size=s) for s in (1, 20, 32, 50, 200)
    ]:
        assert_same_bits(base, ref(q, k, v, window, plan))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_chunked_prefill_chunk_size(dtype, window):
    q, k, v = make_qkv(dtype)
    base = ref(q, k, v, window)
    for chunk in (1, 5, 16, 33, 100, 101, 500):
        assert_same_bits(base, ref(q, k, v, window, ChunkedPrefill(chunk, page_size=16)))
        assert_same_bits(base, ref(q, k, v, window, ChunkedPrefill(chunk, page_size=16, num_splits=3)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_paged_kv_page_size(dtype, window):
    q, k, v = make_qkv(dtype, seq_q=40, seq_kv=101)  # a 61-token cached prefix, then 40 queries
    base = ref(q, k, v, window)
    for page in (1, 3, 16, 32, 64, 128):
        assert_same_bits(base, ref(q, k, v, window, ChunkedPrefill(13, page_size=page, seed=page)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_batch_makeup(dtype, window):
    q, k, v = make_qkv(dtype, seq_q=37, seq_kv=70, seed=1)
    alone = ref(q, k, v, window)
    others = [make_qkv(dtype, seq_q=n, seq_kv=m, seed=s) for n, m, s in ((50, 50, 2), (9, 90, 3), (64, 64, 4))]
    for position in range(len(others) + 1):
        batch = [*others[:position], (q, k, v), *others[position:]]
        cu_q = torch.tensor([0] + [b[0].shape[0] for b in batch]).cumsum(0)
        cu_k = torch.tensor([0] + [b[1].shape[0] for b in batch]).cumsum(0)
        packed = [torch.cat([b[i] for b in batch]) for i in range(3)]
        out, lse = ref(
            *packed, window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, plan=ChunkedPrefill(8) if position % 2 else None
        )
        rows = slice(int(cu_q[position]), int(cu_q[position + 1]))
        assert_same_bits(alone, (out[rows], lse[rows]))


@settings(max_examples=12, deadline=None)
@given(
    seq=st.integers(1, 80),
    cp=st.sampled_from([1, 2, 4, 8]),
    layout=st.sampled_from(LAYOUTS),
    splits=st.integers(1, 6),
    chunk=st.integers(1, 40),
    page=st.integers(1, 40),
    window=st.one_of(st.none(), st.integers(0, 30)),
    dtype=st.sampled_from(DTYPES),
)
def test_property_any_plan_same_bits(seq, cp, layout, splits, chunk, page, window, dtype):
    q, k, v = make_qkv(dtype, seq_q=seq, seed=seq)
    base = ref(q, k, v, window)
    for plan in (
        ContextParallel(cp, layout),
        SplitKV(num_splits=splits),
        ChunkedPrefill(chunk, page, num_splits=splits),
    ):
        assert_same_bits(base, ref(q, k, v, window, plan))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_plans_same_bits(dtype):
    q, k, v = make_qkv(dtype, device="cuda")
    base = ref(q, k, v, 23)
    for plan in (ContextParallel(4, "load_balanced"), SplitKV(num_splits=3), ChunkedPrefill(7, 16)):
        assert_same_bits(base, ref(q, k, v, 23, plan))
