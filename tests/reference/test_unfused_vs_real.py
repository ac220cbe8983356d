"""The Megatron-local and HF-eager replays equal the real modules bit for bit (``torch.equal``).

Real megatron-core 0.16 ``DotProductAttention`` (local spec, world size 1 over gloo) and real
transformers ``eager_attention_forward`` with a real ``LlamaAttention`` and the real
``masking_utils.eager_mask``, on the same inputs; bf16 and fp16, causal and sliding window.
CPU stand-ins, only where megatron-core 0.16 hard-codes CUDA: ``torch.cuda.current_device()``
(its global memory buffer), the CUDA RNG tracker's ``fork()`` around dropout (p=0) and the
``device="cuda"`` of its sliding-window mask (the real mask function runs, on CPU).
"""

from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from nemo_rl_attn_align.reference.blocks import Geometry  # noqa: E402
from nemo_rl_attn_align.reference.materializers import parse_materializer  # noqa: E402
from nemo_rl_attn_align.reference.unfused import hf_eager_attention, megatron_local_attention  # noqa: E402
from tests.reference.conftest import DTYPES, make_qkv  # noqa: E402

WINDOWS = [None, 23]
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32  # head dim 32: head_dim**-0.5 != 1/sqrt(head_dim) in the last bit


class _CpuTorch:
    """``torch`` as megatron's mask helpers see it, but ``torch.ones`` ignores ``device="cuda"``."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def ones(*shape, device=None, **kw):
        return torch.ones(*shape, **kw)


@contextlib.contextmanager
def megatron_on_cpu():
    from megatron.core import tensor_parallel
    from megatron.core.transformer import utils as mutils

    saved = torch.cuda.current_device, tensor_parallel.get_cuda_rng_tracker, mutils.torch
    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda: types.SimpleNamespace(fork=contextlib.nullcontext)
    mutils.torch = _CpuTorch()
    try:
        yield
    finally:
        torch.cuda.current_device, tensor_parallel.get_cuda_rng_tracker, mutils.torch = saved


def megatron_module(dtype, window):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.fake_nemo_rl.cpu_megatron import ensure_model_parallel

    ensure_model_parallel()
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_query_groups=KV_HEADS,
        kv_channels=HEAD_DIM,
        attention_dropout=0.0,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        masked_softmax_fusion=False,
        attention_softmax_in_fp32=True,
        window_size=None if window is None else (window, 0),
    )
    return DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def real_megatron(q, k, v, window):
    """The real module on sbhd views (b=1): output ``[S, Hq, D]``."""
    module = megatron_module(q.dtype, window)
    s = q.shape[0]
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    with megatron_on_cpu():
        out = module(q[:, None], k[:, None], v[:, None], attention_mask=causal)
    return out.view(s, HEADS, HEAD_DIM)


def real_hf_eager(q, k, v, window):
    from transformers.masking_utils import causal_mask_function, eager_mask, sliding_window_causal_mask_function
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig, eager_attention_forward

    config = LlamaConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        attention_dropout=0.0,
    )
    module = LlamaAttention(config, layer_idx=0).eval()
    sq, skv = q.shape[0], k.shape[0]
    # HF's sliding_window counts the query itself: the left window W is sliding_window W + 1
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window + 1)
    mask = eager_mask(1, sq, skv, q_offset=skv - sq, mask_function=fn, dtype=q.dtype)
    heads_first = [x.transpose(0, 1)[None] for x in (q, k, v)]  # [1, H, S, D] views, as HF's
    out, _ = eager_attention_forward(module, *heads_first, mask, scaling=module.scaling)
    return out[0]


def geometry(q, k, window):
    return Geometry.of(q, k, window, None, q.shape[0], k.shape[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_megatron_local_forward_and_backward_equal_the_real_module(dtype, window):
    q, k, v = make_qkv(dtype, seq_q=70, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    real_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ours_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    real = real_megatron(*real_leaves, window)
    ours, lse = megatron_local_attention(*ours_leaves, geometry(q, k, window))
    assert real.dtype == ours.dtype == dtype and lse.shape == q.shape[:2]
    assert torch.equal(real, ours)
    real.backward(dout)
    ours.backward(dout)
    for name, a, b in zip(("dq", "dk", "dv"), real_leaves, ours_leaves, strict=True):
        assert a.grad.abs().max() > 0 and torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("prefix", [0, 9])
def test_hf_eager_forward_equals_the_real_function(dtype, window, prefix):
    q, k, v = make_qkv(dtype, seq_q=70, seq_kv=70 + prefix, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    real = real_hf_eager(q, k, v, window)
    ours, _ = hf_eager_attention(q, k, v, geometry(q, k, window))
    assert torch.equal(real, ours)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_materializers_are_these_replays_and_differ_from_each_other(dtype):
    q, k, v = make_qkv(dtype, seq_q=70, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    mega, _ = parse_materializer("megatron-local")(q, k, v, window=23)
    hf, _ = parse_materializer("hf-eager")(q, k, v, window=23)
    assert torch.equal(mega, real_megatron(q, k, v, 23))
    assert torch.equal(hf, real_hf_eager(q, k, v, 23))
    assert not torch.equal(mega, hf)  # scores rounded to the input dtype before (HF) or after (Megatron) the scale


def test_hf_scale_is_a_python_float_not_rounded_to_the_input_dtype():
    """The old ``plain`` rounded the scale to bf16 (1/sqrt(32) -> 0.1767578125): HF does not."""
    q, k, v = make_qkv(torch.bfloat16, seq_q=70, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    geom = geometry(q, k, None)
    rounded = Geometry.of(q, k, None, float(torch.tensor(HEAD_DIM**-0.5, dtype=torch.bfloat16)), 70, 70)
    assert not torch.equal(hf_eager_attention(q, k, v, geom)[0], hf_eager_attention(q, k, v, rounded)[0])
