"""A real megatron-core GPTModel on CPU for the NeMo-RL stand-ins (local layer spec, gloo, world size 1).

``StandInGPTProvider`` has the attribute names of Megatron-Bridge's ``GPTModelProvider`` (a
``TransformerConfig`` subclass: ``position_embedding_type``, ``rotary_base``, ``rotary_percent``,
``vocab_size``, ``seq_length``), which is what NeMo-RL's ``model_cfg`` is. ``cpu_forward`` replaces
the two CUDA-only spots a megatron-core 0.16 forward touches on CPU: ``torch.cuda.current_device()``
(rotary ``inv_freq`` and the global memory buffer) and the CUDA RNG tracker's ``fork()`` in the
local ``DotProductAttention``; the causal mask is passed in because the default one is made on CUDA.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel

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


def build_gpt(model_cfg: StandInGPTProvider) -> GPTModel:
    """A GPTModel with the local layer spec from ``model_cfg`` (Megatron sets NVTE_* here)."""
    ensure_model_parallel()
    return GPTModel(
        config=model_cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(),
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
