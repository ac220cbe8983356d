"""The step-0 runs of the upstream-bug corpus: which tiny models, which engines, which training sides.

Stdlib only: read by the test session (base venv) and by ``training_side.py`` (lane nemo_rl's venv).
Both sides load one checkpoint per model (``tests/real_vllm/tiny_models.py`` in lane vllm's venv
writes it; the training side reads the same ``config.json`` and tokenizer). Each ``REPORTS`` entry
is one report folder holding a training record and a rollout record, as a NeMo-RL run's report
folder holds them at step 0.
"""

from __future__ import annotations

#: model -> (tiny_models architecture, config keys over it).
MODELS = {
    "mistral": ("mistral", {}),
    "gemma2": ("gemma2", {}),
    # gpt-oss's own sliding window (128): #2656's revert restores the bridge's literal (128, 0)
    "gpt-oss": ("gpt_oss", {"sliding_window": 128}),
    # YaRN as a Qwen3 long-context config writes it, beta_fast / beta_slow given, truncate left out
    # (Hugging Face and vLLM then round the correction band: truncate defaults to true)
    "qwen3-yarn": (
        "qwen3",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            }
        },
    ),
}

#: rollout engine -> (model, vLLM fix taken back out in the engine's process: tests/real_vllm/reverts.py).
ENGINES = {
    "mistral": ("mistral", None),
    "gemma2": ("gemma2", None),
    "gpt-oss": ("gpt-oss", None),
    "qwen3-yarn": ("qwen3-yarn", None),
    "gpt-oss-27722": ("gpt-oss", "vllm-27722"),
}

#: What megatron-core refuses for Gemma 2 under NeMo-RL's GRPO recipe (bias_activation_fusion with
#: its GeLU, on any machine): a Gemma 2 user sets it off.
GEMMA2 = ("++policy.megatron_cfg.bias_activation_fusion=false",)

#: training side -> (model, Megatron-Bridge fix taken back out: bridge_reverts.REVERTS, NeMo-RL
#: recipe overrides as a user writes them on the command line).
TRAINING = {
    "mistral": ("mistral", None, ()),
    "mistral-2656": ("mistral", "megatron-bridge-2656", ()),
    "gemma2": ("gemma2", None, GEMMA2),
    "gemma2-2656": ("gemma2", "megatron-bridge-2656", GEMMA2),
    "gemma2-4875": ("gemma2", "megatron-bridge-4875", GEMMA2),
    # attention_backend local takes megatron-core's local layer spec (the plugin's LOCAL_REQUIRES_LOCAL_SPEC)
    "gemma2-local": (
        "gemma2",
        None,
        (*GEMMA2, "++policy.megatron_cfg.attention_backend=local", "++policy.megatron_cfg.transformer_impl=local"),
    ),
    "gpt-oss": ("gpt-oss", None, ()),
    "gpt-oss-2656": ("gpt-oss", "megatron-bridge-2656", ()),
    "gpt-oss-1155": ("gpt-oss", "megatron-bridge-1155", ()),
    "qwen3-yarn": ("qwen3-yarn", None, ()),
    # the workaround: Megatron rounds the band as Hugging Face and vLLM do. With model_overrides NeMo-RL
    # finalizes the provider again, and megatron-core then refuses the recipe's fused kernels without
    # Transformer Engine (absent here; Megatron-Bridge turns RoPE fusion off for YaRN anyway)
    "qwen3-yarn-rounded": (
        "qwen3-yarn",
        None,
        (
            "++policy.megatron_cfg.model_overrides.yarn_correction_range_round_to_int=true",
            *("++policy.megatron_cfg.apply_rope_fusion=false", "++policy.megatron_cfg.moe_permute_fusion=false"),
        ),
    ),
}

#: report folder -> (training side, rollout engine).
REPORTS = {
    **{name: (name, model) for name, (model, _, _) in TRAINING.items()},
    "vllm-27722": ("gpt-oss", "gpt-oss-27722"),
}
