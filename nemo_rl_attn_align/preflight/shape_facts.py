"""The drift layer of a recipe: the ``attention_align.drift`` block and the sequence length, as ``ShapeFacts``.

Drift resolves its sweep's shape from these, then from the model's own attention
(``model_facts``: the hosts' reading of its config.json, with ``hf_config_overrides`` and
``model_overrides`` applied); ``recipe_facts.read_recipe_facts`` calls ``read_shape_facts``. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.config.config_lookup import Fact, value_at
from nemo_rl_attn_align.vocab.names import BLOCK


@dataclass(frozen=True)
class ShapeFacts:
    """What the config says about the sweep's attention shape, in drift's field names (``heads``,
    ``kv_heads``, ``head_dim``, ``window``, ``hidden``, ``seq_len``).

    ``layers`` are the config's sections that set shape fields, highest priority first (the
    ``attention_align.drift`` block), each a ``Fact`` whose value maps field -> value and whose key
    is the section; ``seq_len`` is ``policy.max_total_sequence_length`` (None when unset)."""

    layers: tuple[Fact, ...] = ()
    seq_len: Fact | None = None


def read_shape_facts(cfg: Any) -> ShapeFacts:
    """Read the drift block and the sequence length of a resolved config."""
    drift = value_at(cfg, f"{BLOCK}.drift")
    layers = (Fact(dict(drift), f"{BLOCK}.drift"),) if isinstance(drift, dict) else ()
    seq = value_at(cfg, "policy.max_total_sequence_length")
    return ShapeFacts(layers, Fact(seq, "policy.max_total_sequence_length") if seq is not None else None)
