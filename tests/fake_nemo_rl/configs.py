"""Resolved NeMo-RL config sections for the stand-ins, as a worker receives them."""

from __future__ import annotations

from typing import Any


def policy_config(
    backend: str = "local", precision: str = "bfloat16", impl: str = "local", **extra: Any
) -> dict[str, Any]:
    """A resolved ``policy`` section for a Megatron policy worker of the stand-in NeMo-RL (tiny model,
    no parallelism); ``extra`` adds or replaces top-level keys (e.g. ``standin_model``, ``generation``)."""
    return {
        "model_name": "standin/tiny",
        "tokenizer": {"name": "standin/tiny"},
        "precision": precision,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 4,
        "megatron_cfg": {
            "enabled": True,
            "attention_backend": backend,
            "transformer_impl": impl,
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "context_parallel_size": 1,
            "sequence_parallel": False,
            "apply_rope_fusion": False,
            "pipeline_dtype": precision,
        },
        **extra,
    }
