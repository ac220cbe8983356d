"""The mandate: what the user demands of the semantic tier (``attention_align.mandate``), stdlib only.

Part of the contract's vocabulary with ``schema`` and ``kinds``: ``config.settings`` builds one from
the YAML, ``binding.binding`` checks both sides against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

from nemo_rl_attn_align.vocab.schema import ContractError, field_spec


@dataclass(frozen=True)
class Mandate:
    """What the user demands of the semantic tier; ``None`` for a field means no demand.

    Defaults: the canonical reduction of RL-Align's reference (online-softmax LSE merge, partials
    folded by global KV block index, FP32 accumulators, one downcast at the final write). ``dtype``
    has no default here; ``settings.load_settings`` fills it from ``policy.precision``.
    """

    merge_rule: str | None = "online_softmax_lse"
    reduction_order: str | None = "kv_index"
    acc_dtype: str | None = "fp32"
    downcast: str | None = "final_write"
    dtype: str | None = None

    def __post_init__(self):
        for item in dataclass_fields(self):
            raw = getattr(self, item.name)
            if raw is not None:
                try:
                    object.__setattr__(self, item.name, field_spec(item.name).validate(raw))
                except ContractError as err:
                    raise ContractError(f"mandate {err}") from None

    def demand(self, name: str) -> str | None:
        """The demanded value of semantic field ``name`` (``None``: no demand)."""
        return getattr(self, name)

    def to_dict(self) -> dict[str, str | None]:
        return {item.name: getattr(self, item.name) for item in dataclass_fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mandate:
        return cls(**dict(data))
