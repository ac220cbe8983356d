"""Attention backend names, their megatron-core ``AttnBackend`` members, and the NVTE variables.

The names are known here without importing megatron-core (``import megatron.core`` costs seconds);
``tests/test_backend_enum.py`` proves them equal to the real enum's members.

Facts (megatron-core ``transformer/enums.py`` and
``models/common/language_module/language_module.py::_set_attention_backend``, 0.11 to HEAD):
``AttnBackend`` is flash=1, fused=2, unfused=3, local=4, auto=5; when the model is built, Megatron
sets NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN to the values in ``NVTE_BY_BACKEND``
and asserts that a value already in the environment agrees.
"""

from __future__ import annotations

#: AttnBackend member name -> value, in enum order.
ATTN_BACKEND_VALUES = {"flash": 1, "fused": 2, "unfused": 3, "local": 4, "auto": 5}

#: Every valid ``policy.megatron_cfg.attention_backend`` value.
BACKEND_NAMES = tuple(ATTN_BACKEND_VALUES)

#: Megatron's own default when ``attention_backend`` is not set.
DEFAULT_BACKEND = "auto"

#: The TE selection variables, in the order Megatron sets them.
NVTE_VARIABLES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")

#: Values Megatron's ``_set_attention_backend`` writes for each backend.
NVTE_BY_BACKEND = {
    "local": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
    "auto": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"},
}

#: Transformer Engine backends that compute only in fp16/bf16 (TE ``dot_product_attention/utils.py::
#: get_attention_backend``, "Filter: Data type": FlashAttention and FusedAttention are disabled for any
#: other qkv_dtype; only UnfusedDotProductAttention runs FP32).
HALF_PRECISION_ONLY = ("flash", "fused")

#: AttnBackend name -> the Transformer Engine class that runs it (``local`` is Megatron's own).
TE_CLASS_BY_BACKEND = {
    "flash": "FlashAttention",
    "fused": "FusedAttention",
    "unfused": "UnfusedDotProductAttention",
    "local": "local",
}


def to_attn_backend(name: str):
    """The real ``megatron.core.transformer.enums.AttnBackend`` member for ``name`` (imports megatron-core)."""
    from megatron.core.transformer.enums import AttnBackend

    return AttnBackend[name]


#: Megatron's ``cp_comm_type`` values (TransformerConfig): how TE's context-parallel attention exchanges KV.
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
