"""The identity a model's ``config.json`` (``model.model_config``) fixes for both sides alike.

Both sides build the model from this file; what their attention layers become is each host's
reading (``model.model_facts``, ``contract.attention_identity``). Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.contract.rope import canonical_rope, hf_rope
from nemo_rl_attn_align.model.model_config import text_config


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def identity_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The identity fields a config.json fixes for both sides alike, beyond the attention layers
    (``contract.attention_identity`` reads those from each host's build): the architecture, the
    vocabulary, RoPE, soft capping and the softmax scale (fields it does not fix are left out).

    ``softmax_scale`` is ``query_pre_attn_scalar ** -0.5`` where the model has one (Gemma 2/3),
    else ``head_dim ** -0.5`` (not under multi-latent attention, whose scale YaRN's mscale sets in
    the engines); ``logit_softcapping`` is ``attn_logit_softcapping`` (None: none).
    """
    hf = text_config(hf)
    heads = _positive_int(hf.get("num_attention_heads"))
    out: dict[str, Any] = {}
    architectures = hf.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        out["architecture"] = architectures[0]
    if _positive_int(hf.get("vocab_size")):
        out["vocab_size"] = hf["vocab_size"]
    hidden = _positive_int(hf.get("hidden_size"))
    head_dim = _positive_int(hf.get("head_dim")) or (hidden // heads if hidden and heads else None)
    if head_dim and hf.get("kv_lora_rank") is None:
        scalar = hf.get("query_pre_attn_scalar")
        base = scalar if isinstance(scalar, (int, float)) and not isinstance(scalar, bool) and scalar > 0 else head_dim
        out["softmax_scale"] = 1.0 / math.sqrt(base)
    cap = hf.get("attn_logit_softcapping")
    out["logit_softcapping"] = (
        float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    )
    rope = hf_rope(hf)
    out["rope_type"], out["rope_parameters"] = canonical_rope(
        rope["rope_theta"], rope["partial_rotary_factor"], rope["rope_scaling"]
    )
    return out
