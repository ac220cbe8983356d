"""A real megatron-core GPTModel on CPU for the NeMo-RL stand-ins (local layer spec, gloo, world size 1).

``StandInGPTProvider`` has the attribute names of Megatron-Bridge's ``GPTModelProvider`` (a
``TransformerConfig`` subclass: ``position_embedding_type``, ``rotary_base``, ``rotary_percent``,
``vocab_size``, ``seq_length``), which is what NeMo-RL's ``model_cfg`` is. ``cpu_forward`` replaces
the two CUDA-only spots a megatron-core 0.16 forward touches on CPU: ``torch.cuda.current_device()``
(rotary ``inv_freq`` and the global memory buffer) and the CUDA RNG tracker's ``fork()`` in the
local ``DotProductAttention``; the causal mask is passed in because the default one is made on CUDA.
A packed (``thd``) batch runs only through Transformer Engine's core attention, on a GPU:
``build_gpt(..., packed=True)`` puts ``PackedAttentionStandIn`` in its place (the one stand-in;
the attention layers that call it, their RoPE and the rest of the model are megatron-core's).
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.transformer_config import TransformerConfig

from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel
from nemo_rl_attn_align.reference.attention import exact_attention
from nemo_rl_attn_align.reference.causal import Causal

TINY_MODEL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "vocab_size": 128,
    "seq_length": 32,
}


@dataclasses.dataclass
class StandInGPTProvider(TransformerConfig):
    """Stand-in for Megatron-Bridge's GPTModelProvider: a TransformerConfig plus the GPTModel arguments."""

    position_embedding_type: str = "rope"
    rotary_base: int = 10000
    rotary_percent: float = 1.0
    seq_len_interpolation_factor: float | None = None
    vocab_size: int = 128
    seq_length: int = 32


class PackedAttentionStandIn(DotProductAttention):
    """CPU stand-in for Transformer Engine's core attention (``TEDotProductAttention``), the one
    megatron-core runs packed ``thd`` batches with (its local ``DotProductAttention`` asserts
    ``packed_seq_params is None``): causal attention computed exactly (the project's FP64 reference)
    within each sequence the ``cu_seqlens`` delimit (the padded ones where given, TE's offsets), else
    within each row of the ``[s, b, h, d]`` input. Megatron's ``DotProductAttention.__init__`` sets
    its scale. Forward only."""

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            cu_q, cu_kv = (
                getattr(packed_seq_params, f"{name}_padded")
                if getattr(packed_seq_params, f"{name}_padded") is not None
                else getattr(packed_seq_params, name)
                for name in ("cu_seqlens_q", "cu_seqlens_kv")
            )
            out, _ = exact_attention(
                query, key, value, Causal(scale=self.softmax_scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_kv)
            )
            return out.to(query.dtype).reshape(query.shape[0], -1)
        rows = [
            exact_attention(query[:, b], key[:, b], value[:, b], Causal(scale=self.softmax_scale))[0]
            for b in range(query.shape[1])
        ]
        return torch.stack(rows, 1).to(query.dtype).reshape(query.shape[0], query.shape[1], -1)


def packed_layer_spec():
    """megatron-core's local layer spec with ``PackedAttentionStandIn`` as each layer's core attention."""
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = PackedAttentionStandIn
    return spec


def build_gpt(model_cfg: StandInGPTProvider, packed: bool = False) -> GPTModel:
    """A GPTModel with the local layer spec from ``model_cfg`` (Megatron sets NVTE_* here); ``packed``:
    with ``PackedAttentionStandIn`` (``packed_layer_spec``), so packed batches run on CPU."""
    ensure_model_parallel()
    return GPTModel(
        config=model_cfg,
        transformer_layer_spec=packed_layer_spec() if packed else get_gpt_layer_local_spec(),
        vocab_size=model_cfg.vocab_size,
        max_sequence_length=model_cfg.seq_length,
        position_embedding_type=model_cfg.position_embedding_type,
        rotary_base=model_cfg.rotary_base,
        rotary_percent=model_cfg.rotary_percent,
    )


def cpu_forward(model, batch: int = 2, seq: int = 16) -> torch.Tensor:
    """Logits of one forward of ``model`` (a module or a list of chunks) on random tokens."""
    module = model[0] if isinstance(model, (list, tuple)) else model
    ids = torch.randint(0, module.vocab_size, (batch, seq))
    positions = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    causal = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
    with cpu_only(), torch.no_grad():
        return module(ids, positions, attention_mask=causal)
