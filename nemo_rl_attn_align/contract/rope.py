"""One spelling of RoPE settings for both sides, so the identity tier compares meaning, not syntax.

Megatron describes RoPE with ``position_embedding_type``/``rotary_base``/``rotary_percent`` on the
model config plus ``rope_scaling``/``rope_scaling_factor`` (Llama 3.x frequency scaling, a
``GPTModel`` argument that Megatron-Bridge's providers carry) or ``seq_len_interpolation_factor``
(linear); Hugging Face configs (what vLLM runs) use ``rope_theta``, ``partial_rotary_factor`` and a
``rope_scaling`` dict (transformers >= 5: one ``rope_parameters`` dict). ``canonical_rope`` maps
either onto ``(rope_type, {"theta", "partial_rotary_factor", "scaling"?})`` (YaRN's ``truncate``
written out: Hugging Face's and vLLM's default true where a config leaves it out); ``hf_rope`` reads the
Hugging Face values from a config object or a ``config.json`` mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Megatron's Llama 3.x scaling constants (``rotary_pos_embedding.py::_apply_scaling`` defaults;
#: only ``factor`` is configurable there), the values Llama 3.1's HF config also carries.
MEGATRON_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def canonical_rope(theta: Any, partial_rotary_factor: Any, scaling: Mapping[str, Any] | None) -> tuple[str, dict]:
    """``(rope_type, parameters)``: plain RoPE is ``"default"`` with no ``scaling`` entry; numbers as floats."""
    params: dict[str, Any] = {
        "theta": _number(theta),
        "partial_rotary_factor": _number(1.0 if partial_rotary_factor is None else partial_rotary_factor),
    }
    if not isinstance(scaling, Mapping):
        return "default", {k: v for k, v in params.items() if v is not None}
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type == "yarn":  # Hugging Face and vLLM round the correction band unless it says otherwise
        scaling = {"truncate": True, **scaling}
    extra = {k: _number(v) for k, v in sorted(scaling.items()) if k not in ("rope_type", "type")}
    if rope_type != "default" or extra:
        params["scaling"] = extra
    return rope_type, {k: v for k, v in params.items() if v is not None}


def megatron_scaling(
    rope_scaling: Any, rope_scaling_factor: Any = None, seq_len_interpolation_factor: Any = None
) -> dict[str, Any] | None:
    """The HF-style scaling dict that Megatron's own RoPE settings (``rope_scaling``,
    ``rope_scaling_factor``: 8.0 when unset, ``seq_len_interpolation_factor``) amount to, or None
    for plain RoPE."""
    if rope_scaling is True:
        factor = 8.0 if rope_scaling_factor is None else rope_scaling_factor
        return {"rope_type": "llama3", "factor": factor, **MEGATRON_LLAMA3_SCALING}
    if seq_len_interpolation_factor is not None:
        return {"rope_type": "linear", "factor": seq_len_interpolation_factor}
    return None


def hf_rope(hf: Any) -> dict[str, Any]:
    """RoPE values of an HF config (the object, or a ``config.json`` mapping): ``rope_theta``,
    ``rope_scaling`` (None for plain RoPE), ``partial_rotary_factor``, and ``rope_source``: the
    attribute they were read from.

    transformers >= 5 keeps them in one ``rope_parameters`` dict (``{"rope_type": "default",
    "rope_theta": ...}``); older releases have ``rope_theta`` and ``rope_scaling`` attributes.
    """
    get = hf.get if isinstance(hf, Mapping) else lambda name: getattr(hf, name, None)
    params = get("rope_parameters")
    if isinstance(params, Mapping):
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        plain = set(scaling) <= {"rope_type"} and scaling.get("rope_type", "default") == "default"
        in_params = "partial_rotary_factor" in params
        return {
            "rope_theta": params.get("rope_theta"),
            "rope_scaling": None if plain else scaling,
            "partial_rotary_factor": params.get("partial_rotary_factor", get("partial_rotary_factor")),
            "rope_source": "hf_config.rope_parameters"
            + ("" if in_params or get("partial_rotary_factor") is None else " + partial_rotary_factor"),
        }
    return {
        "rope_theta": get("rope_theta"),
        "rope_scaling": get("rope_scaling"),
        "partial_rotary_factor": get("partial_rotary_factor"),
        "rope_source": "hf_config.rope_theta/partial_rotary_factor/rope_scaling",
    }
