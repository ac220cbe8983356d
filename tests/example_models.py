"""The models the shipped examples and the tests name, as config.json files in a Hugging Face cache.

``check`` reads a model only from this machine, so the tests (``tests/conftest.py`` points
``HF_HUB_CACHE`` at such a cache for the whole session) and ``scripts/update_kernel_tables.py
docs`` write one: each model's config.json made with transformers' own config class, at the
published checkpoint's sizes.
"""

from __future__ import annotations

from pathlib import Path

#: The models the shipped examples and the tests name, as config.json files made with transformers'
#: own config classes at the published checkpoints' sizes (model type, config arguments), in a
#: Hugging Face cache of the test session's own: ``check`` reads a model only from this machine.
EXAMPLE_MODELS = {
    "Qwen/Qwen2.5-1.5B": ("qwen2", {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
                                    "num_hidden_layers": 28, "vocab_size": 151936, "intermediate_size": 8960}),
    "Qwen/Qwen3-8B": ("qwen3", {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                                "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936}),
    "meta-llama/Llama-3.1-8B": ("llama", {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                                          "num_hidden_layers": 32, "vocab_size": 128256}),
    "meta-llama/Llama-3.2-1B-Instruct": ("llama", {"hidden_size": 2048, "num_attention_heads": 32,
                                                   "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16,
                                                   "vocab_size": 128256, "tie_word_embeddings": True}),
    "openai/gpt-oss-20b": ("gpt_oss", {"num_hidden_layers": 24}),  # transformers' defaults are gpt-oss-20b's
}  # fmt: skip


def write_transformers_config(folder: Path, model_type: str, **kwargs) -> Path:
    """``folder/config.json`` of transformers' own config class for ``model_type`` (``architectures``
    as transformers' causal-LM mapping names it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(model_type, **kwargs)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    config.save_pretrained(folder)
    return folder


def write_example_model_cache(cache: Path) -> Path | None:
    """``cache`` holding ``EXAMPLE_MODELS`` as hub snapshots (None where transformers is not installed)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    for name, (model_type, kwargs) in EXAMPLE_MODELS.items():
        repo = cache / ("models--" + name.replace("/", "--"))
        write_transformers_config(repo / "snapshots" / ("0" * 40), model_type, **kwargs)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("0" * 40)
    return cache
