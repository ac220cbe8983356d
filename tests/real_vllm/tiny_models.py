"""Tiny random-weight models made at test time (no hub): an HF config per architecture, its
weights saved with ``save_pretrained`` and a word-level tokenizer built with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path

SHAPE = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
}

#: Architecture -> (transformers config class, model class, extra config keys).
ARCHITECTURES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_theta": 1000000.0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64, "rope_theta": 10000.0}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "sliding_window": 64,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 64,
            "tie_word_embeddings": True,
        },
    ),  # vLLM's Gemma2 has no lm_head
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {"sliding_window": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "rope_theta": 150000.0},
    ),  # learnable softmax sinks, every other layer windowed; YaRN with truncate false (vLLM #27722)
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 64,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
            "tie_word_embeddings": True,
        },
    ),  # a local and a global RoPE (linear scaling on the global one), one windowed layer
    "glm4": (
        "Glm4Config",
        "Glm4ForCausalLM",
        {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},  # its defaults are past the tiny vocabulary
    ),  # half the channels rotated, in adjacent (GPT-J) pairs
}


def save_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level fast tokenizer of ``vocab_size`` tokens, saved as ``tokenizer.json`` and friends."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(directory)


def make_model(directory: Path, architecture: str, seed: int = 0, overrides: dict | None = None) -> Path:
    """Write a tiny random-weight ``architecture`` model with its tokenizer to ``directory``
    (``overrides``: config keys over the architecture's)."""
    import torch
    import transformers

    config_cls, model_cls, extra = ARCHITECTURES[architecture]
    config = getattr(transformers, config_cls)(**{**SHAPE, "tie_word_embeddings": False, **extra, **(overrides or {})})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    save_tokenizer(directory, SHAPE["vocab_size"])
    return directory
