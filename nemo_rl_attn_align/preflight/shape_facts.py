"""The shape layer of a recipe: the config sections that set attention-shape fields, as ``ShapeFacts``.

Drift resolves its sweep's shape from these layers (``drift/shape.py``), highest priority first;
``facts.read_recipe_facts`` calls ``read_shape_facts``. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.preflight.config_lookup import Fact, value_at


def _left_window(value: Any) -> Any:
    """Megatron's ``window_size`` is ``(left, right)``; keep the left size (``-1``/None: none)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value in (None, -1) else value


def _hf_window(hf: dict) -> Any:
    """HF ``sliding_window`` counts the query itself; the left window is one less."""
    window = hf.get("sliding_window")
    if hf.get("use_sliding_window") is False or window in (None, 0):
        return None
    return window - 1 if isinstance(window, int) and not isinstance(window, bool) else window


@dataclass(frozen=True)
class ShapeFacts:
    """What the config says about the attention shape, in drift's field names (``heads``, ``kv_heads``,
    ``head_dim``, ``window``, ``hidden``, ``seq_len``).

    ``layers`` are the config's sections that set shape fields, highest priority first, each a
    ``Fact`` whose value maps field -> value (None: not set there) and whose key is the section;
    ``seq_len`` is ``policy.max_total_sequence_length`` (None when unset)."""

    layers: tuple[Fact, ...] = ()
    seq_len: Fact | None = None


def read_shape_facts(cfg: Any) -> ShapeFacts:
    """Read the attention-shape layers of a resolved config (none where a section is not a dict)."""
    layers = []
    drift = value_at(cfg, "attention_align.drift")
    if isinstance(drift, dict):
        layers.append(Fact(dict(drift), "attention_align.drift"))
    mo = value_at(cfg, "policy.megatron_cfg.model_overrides")
    if isinstance(mo, dict):
        layers.append(
            Fact(
                {
                    "heads": mo.get("num_attention_heads"),
                    "kv_heads": mo.get("num_query_groups"),
                    "head_dim": mo.get("kv_channels"),
                    "window": _left_window(mo.get("window_size")),
                    "hidden": mo.get("hidden_size"),
                },
                "policy.megatron_cfg.model_overrides",
            )
        )
    hf = value_at(cfg, "policy.hf_config_overrides")
    if isinstance(hf, dict):
        layers.append(
            Fact(
                {
                    "heads": hf.get("num_attention_heads"),
                    "kv_heads": hf.get("num_key_value_heads"),
                    "head_dim": hf.get("head_dim"),
                    "window": _hf_window(hf),
                    "hidden": hf.get("hidden_size"),
                },
                "policy.hf_config_overrides",
            )
        )
    seq = value_at(cfg, "policy.max_total_sequence_length")
    seq_fact = Fact(seq, "policy.max_total_sequence_length") if seq is not None else None
    return ShapeFacts(tuple(layers), seq_fact)
