"""A tiny random-weight Llama checkpoint made with transformers' own classes (no hub), in float32,
for both engines of the cross-engine probe: ``python -m tests.real_cross_engine.tiny_llama DIR``.

Llama, because Megatron-Bridge's Llama bridge maps the local layer spec's norms
(``input_layernorm``, ``pre_mlp_layernorm``) as well as Transformer Engine's fused ones, and vLLM
reads it as a Llama-family model. Every norm weight is moved off its initial ones, so a norm the
bridge did not load would show as a difference, never agree by chance."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.real_vllm.tiny_models import SHAPE

ROPE_THETA = 10000.0


def make(directory: Path, seed: int = 0) -> Path:
    """Write the checkpoint (``config.json``, ``model.safetensors``) to ``directory``."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**SHAPE, "tie_word_embeddings": False, "rope_theta": ROPE_THETA})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    make(Path(sys.argv[1]))
