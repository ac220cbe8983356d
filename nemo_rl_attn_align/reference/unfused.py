"""Replays of the two unfused attentions that run on a CPU: Megatron's local and HF eager.

Both are plain torch programs, so a replay that issues the same torch calls on tensors of the same
shapes and strides gives the real module's bits on the same device; ``tests/reference/
test_unfused_vs_real.py`` shows ``torch.equal`` against the real modules (forward, and backward for
Megatron), bf16 and fp16, causal and sliding window. Both take one sequence ``q`` ``[S, Hq, D]``,
``k``/``v`` ``[Skv, Hkv, D]`` (bottom-right aligned, as in ``blocks.Geometry``) and are
differentiable through autograd. Neither engine returns an LSE; the one returned here is the
FP32 log-sum-exp of the masked scores, for the drift report only.

* ``megatron_local_attention`` -- megatron-core 0.14-0.16 ``DotProductAttention.forward``
  (``megatron/core/transformer/dot_product_attention.py``, the local layer spec) with
  ``FusedScaleMaskSoftmax.forward_torch_softmax`` (``megatron/core/fusions/fused_softmax.py``):
  KV heads ``repeat_interleave``-d to the query heads, scores by one ``baddbmm`` in the input
  dtype with ``alpha=softmax_scale`` (a Python float), masked entries filled with ``-10000.0``
  (``transformer/utils.attention_mask_func``), softmax in FP32 when
  ``attention_softmax_in_fp32`` (else in the input dtype), probabilities cast back, ``bmm`` with V
  in the input dtype. The fused CUDA softmax (``masked_softmax_fusion`` with Megatron's compiled
  extension) is a different kernel and is not replayed. Any GPU (it is cuBLAS GEMMs there).
* ``hf_eager_attention`` -- transformers 5.5-5.8 ``eager_attention_forward``
  (``transformers/models/llama/modeling_llama.py``; Qwen2/3 and Mistral share it): ``repeat_kv``
  by expand + reshape, ``matmul(q, k^T)`` in the input dtype, times ``scaling =
  head_dim ** -0.5`` kept a Python float (so FP32 arithmetic, one rounding to the input dtype),
  plus the additive mask of ``masking_utils.eager_mask`` (0 / ``finfo(dtype).min`` in the input
  dtype), softmax with ``dtype=torch.float32`` cast back, ``matmul`` with V in the input dtype.
"""

from __future__ import annotations

import torch

from nemo_rl_attn_align.reference.blocks import Geometry

#: Megatron's ``attention_mask_func`` fill value.
MEGATRON_MASK_FILL = -10000.0


def _visible(geom: Geometry, device) -> torch.Tensor:
    """Boolean ``[Sq, Skv]``: True where a query may see a key."""
    return geom.allowed(
        torch.arange(geom.q_start, geom.seq_kv, device=device), torch.arange(geom.seq_kv, device=device)
    )


def _masked_lse(scores32: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """FP32 ``[Sq, Hq]`` log-sum-exp of ``[1, Hq, Sq, Skv]`` FP32 scores over the visible keys."""
    return torch.logsumexp(scores32.detach().masked_fill(~visible, float("-inf")), dim=-1)[0].T.contiguous()


def megatron_local_attention(q, k, v, geom: Geometry, softmax_in_fp32: bool = True):
    """Megatron's local ``DotProductAttention`` (b=1, sbhd inside): ``(out [S, Hq, D], lse)``."""
    sq, hq, d = q.shape
    group = geom.group
    query, key, value = q[:, None], k[:, None], v[:, None]  # [s, b=1, heads, d]
    if group > 1:
        key, value = key.repeat_interleave(group, dim=2), value.repeat_interleave(group, dim=2)
    skv = key.shape[0]
    query = query.reshape(sq, hq, -1)
    key = key.view(skv, hq, -1)
    buffer = torch.empty((hq, sq, skv), dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(
        buffer, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=geom.softmax_scale
    ).view(1, hq, sq, skv)
    visible = _visible(geom, q.device)
    if softmax_in_fp32 and q.dtype != torch.float32:
        scores = scores.float()
    masked = scores.masked_fill(~visible, MEGATRON_MASK_FILL)
    probs = torch.softmax(masked, dim=-1)
    lse = _masked_lse(masked.float(), visible)
    probs = probs.to(q.dtype).view(hq, sq, -1)
    context = torch.bmm(probs, value.view(skv, hq, -1).transpose(0, 1))  # [hq, sq, d]
    return context.view(1, hq, sq, d).permute(2, 0, 1, 3).contiguous()[:, 0], lse


def hf_scaling(geom: Geometry) -> float:
    """HF's ``scaling``: ``head_dim ** -0.5`` (not always ``1 / sqrt(head_dim)`` to the last bit)."""
    return geom.scale if geom.scale is not None else geom.head_dim**-0.5


def hf_eager_attention(q, k, v, geom: Geometry):
    """transformers' ``eager_attention_forward`` (batch 1): ``(out [S, Hq, D], lse)``."""
    group = geom.group
    query = q.transpose(0, 1)[None]  # [1, Hq, S, D] view
    key, value = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, Skv, D] views
    if group > 1:

        def repeat(x):
            b, h, s, dim = x.shape
            return x[:, :, None].expand(b, h, group, s, dim).reshape(b, h * group, s, dim)

        key, value = repeat(key), repeat(value)
    visible = _visible(geom, q.device)
    mask = torch.where(visible, 0.0, torch.finfo(q.dtype).min).to(q.dtype)  # masking_utils.eager_mask
    weights = torch.matmul(query, key.transpose(2, 3)) * hf_scaling(geom) + mask
    lse = _masked_lse(weights.float(), visible)
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()[0]
    return out, lse
