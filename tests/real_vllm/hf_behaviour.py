"""The behaviour fields (``vocab.behaviour``) Hugging Face's own modules give for a model directory:
the oracle the vLLM reader (``hosts.vllm_behaviour``) is held against in the real_vllm lane.

``rope``: the model's own rotary module (``model.model.rotary_emb``, built by transformers' rope init
functions; Gemma 3 asked for the layer's type) and its modeling file's ``apply_rotary_pos_emb``,
evaluated on one-hot vectors by ``hosts.behaviour_probe`` as the reader evaluates vLLM's. ``mask``:
causal, and ``sliding_window - 1`` keys before the query on the layers ``config.layer_types`` makes
sliding (every layer where the config has no ``layer_types``). ``softmax``: each attention module's
``scaling``, the config's ``attn_logit_softcapping``, ``sinks`` where the module has them. The model
is built from its ``config.json`` (random weights: none of this depends on them).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import torch

from nemo_rl_attn_align.hosts.behaviour_probe import rope_value, rotation_kind
from nemo_rl_attn_align.vocab.behaviour import ROPE_POSITIONS, mask, per_layer, softmax


def hf_model(model_dir: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _rope_kind(model, index: int, positions: list[int]) -> dict[str, Any]:
    attention = model.model.layers[index].self_attn
    apply_rotary = sys.modules[type(attention).__module__].apply_rotary_pos_emb
    rotary = model.model.rotary_emb
    layer_type = (
        model.config.layer_types[index] if "layer_type" in inspect.signature(rotary.forward).parameters else None
    )
    head_dim = attention.head_dim

    def apply(basis: torch.Tensor, at: list[int]) -> torch.Tensor:
        query = basis.reshape(len(at), head_dim, 1, head_dim)  # [batch: one per position, heads: channels, seq 1, d]
        position_ids = torch.tensor(at).reshape(-1, 1)
        cos, sin = rotary(query, position_ids, layer_type) if layer_type else rotary(query, position_ids)
        rotated, _ = apply_rotary(query, query.clone(), cos, sin)
        return rotated.reshape(len(at), head_dim, head_dim)

    return rotation_kind(apply, head_dim, positions)


def _window(config, index: int) -> int | None:
    types = getattr(config, "layer_types", None)
    sliding = types is None or types[index] == "sliding_attention"
    window = getattr(config, "sliding_window", None)
    return window - 1 if sliding and window else None


def _softmax_kind(config, attention) -> dict[str, Any]:
    return {
        "scale": float(attention.scaling),
        "softcap": getattr(config, "attn_logit_softcapping", None) or None,
        "sinks": "learnable" if isinstance(getattr(attention, "sinks", None), torch.Tensor) else "none",
    }


def hf_behaviour(model_dir: Path) -> dict[str, dict]:
    """``rope`` (at every position of ``ROPE_POSITIONS``), ``mask`` and ``softmax`` of the model in
    ``model_dir`` as Hugging Face computes them."""
    model = hf_model(model_dir)
    config, layers = model.config, range(len(model.model.layers))
    with torch.no_grad():
        rope = rope_value({i: _rope_kind(model, i, list(ROPE_POSITIONS)) for i in layers}, ROPE_POSITIONS)
    return {
        "rope": rope,
        "mask": mask(per_layer({i: {"causal": True, "window": _window(config, i)} for i in layers}), "hf mask"),
        "softmax": softmax(
            per_layer({i: _softmax_kind(config, model.model.layers[i].self_attn) for i in layers}), "hf softmax"
        ),
    }
