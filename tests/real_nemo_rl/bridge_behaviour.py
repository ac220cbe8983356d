"""``python -m tests.real_nemo_rl.bridge_behaviour``: the behaviour fields the Megatron
worker records (``hosts.megatron_behaviour``) for models Megatron-Bridge builds from tiny configs of
transformers' own config classes, beside what Hugging Face's own model computes for the same config.

Each model is built as NeMo-RL builds it (``AutoBridge.from_hf_config(...).to_megatron_provider(
load_weights=False)``, ``finalize()``, ``provide()``), on the CPU as ``probe/bridge_side.py`` builds
one: megatron-core imported before the Transformer Engine stand-in, the local layer spec, fp32,
``cpu_only``. A converter's own attention modules stay where they build without TE: Gemma 2's core
attention (``Gemma2FlexDotProductAttention``) and Gemma 3's self-attention (``Gemma3SelfAttention``,
which picks the local or global RoPE) on the local spec's linear layers; Gemma 3's core attention
is Transformer Engine's, so its mask and softmax here are the local module's, not the converter's.

The reference per layer: the window Hugging Face's ``layer_types`` / ``sliding_window`` give
(``sliding_window - 1`` keys before the query), the scale and soft cap of its attention, and its
rotary module's (cos, sin) at ``ROPE_POSITIONS`` (angles and magnitudes of half-split pairs, as its
``rotate_half`` pairs them). Prints one JSON line: model -> {"training": {field: [provenance,
value, source]}, "problems", "hf": {"rope", "mask", "softmax"}, "preview": ``check``'s preview of
the same config}. ``build_on_cpu`` is how the upstream-bug corpus
(``tests/upstream_bugs/training_side.py``) builds the model NeMo-RL's worker path configured; the
upstream bugs themselves are re-introduced and caught there.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.probe.bridge_side import _cpu_settings, import_bridge
from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel, own_nvte_environment
from nemo_rl_attn_align.vocab.behaviour import ROPE_POSITIONS, per_layer

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 256,
    "num_hidden_layers": 4,
}
WINDOW = 8
#: model type -> config arguments over ``TINY``.
MODELS = {
    "llama": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192},
              "max_position_embeddings": 131072},
    "qwen3": {},
    "mistral": {"sliding_window": WINDOW},
    "gemma2": {"sliding_window": WINDOW, "query_pre_attn_scalar": 16},
    "gemma3_text": {"sliding_window": WINDOW, "query_pre_attn_scalar": 16, "num_hidden_layers": 6},
    "gpt_oss": {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2},
}  # fmt: skip


def hf_config(model_type: str):
    """The tiny config of ``model_type`` (``architectures`` as transformers' causal-LM mapping names it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(model_type, **{**TINY, **MODELS[model_type]})
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config


def _cpu_spec(provider: Any) -> None:
    """The local layer spec, keeping a converter's own attention modules that build without TE."""
    from megatron.bridge.models.gpt_provider import default_layer_spec
    from megatron.core.transformer.enums import AttnBackend

    own = provider.transformer_layer_spec
    _cpu_settings(provider)
    if own is default_layer_spec or not callable(own):
        return
    theirs, spec = own(provider).submodules.self_attention, provider.transformer_layer_spec(provider)
    mine = spec.submodules.self_attention
    mine.module, mine.params = theirs.module, theirs.params
    core = theirs.submodules.core_attention
    if isinstance(core, type) and not any(cls.__name__ == "TEDotProductAttention" for cls in core.__mro__):
        mine.submodules.core_attention = core
        # provide() swaps any core attention for megatron-core's local one under AttnBackend.local
        provider.attention_backend = AttnBackend.auto
    provider.transformer_layer_spec = spec


def megatron_model(model_type: str, attention_backend: str | None = None):
    """The model Megatron-Bridge provides for the tiny config (``attention_backend``: as NeMo-RL's
    ``megatron_cfg.attention_backend`` sets it on the provider)."""
    from megatron.core.transformer.enums import AttnBackend

    bridge, _ = import_bridge()
    provider = bridge.AutoBridge.from_hf_config(hf_config(model_type)).to_megatron_provider(load_weights=False)
    if attention_backend is not None:
        provider.attention_backend = AttnBackend[attention_backend]
    return build_on_cpu(provider)


def build_on_cpu(provider: Any):
    """The model ``provider`` provides, built on the CPU in float32 (``_cpu_spec``): under
    ``attention_backend: local`` Megatron-Bridge's ``provide()`` swaps a converter's core attention for
    megatron-core's, as on a GPU."""
    import torch
    from megatron.core.transformer.enums import AttnBackend

    asked = provider.attention_backend
    provider.bf16 = provider.fp16 = False
    provider.params_dtype = provider.pipeline_dtype = torch.float32
    _cpu_spec(provider)
    if asked == AttnBackend.local:
        provider.attention_backend = asked
    provider.layernorm_zero_centered_gamma = False  # Gemma's norm: torch's LayerNorm lacks it (no attention change)
    provider.moe_permute_fusion = provider.moe_grouped_gemm = False  # TE's kernels (a recipe turns them on)
    if provider.num_moe_experts:  # gpt-oss's experts: without CUDA streams
        provider.moe_token_dispatcher_type = "allgather"
    provider.finalize()
    with cpu_only(), own_nvte_environment():  # Megatron asserts the NVTE variables, then sets them
        return provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)


def _hf_rope(model: Any, config: Any, layer: int) -> dict:
    """Layer ``layer``'s rotary as Hugging Face's model computes it: (cos, sin) at ``ROPE_POSITIONS``."""
    import torch

    inner = model.model
    positions = torch.tensor([ROPE_POSITIONS])
    x = torch.zeros(1, len(ROPE_POSITIONS), config.head_dim)
    layer_type = (getattr(config, "layer_types", None) or [None] * (layer + 1))[layer]
    try:
        cos, sin = inner.rotary_emb(x, positions, layer_type)
    except TypeError:
        cos, sin = inner.rotary_emb(x, positions)
    n = config.head_dim // 2  # cos holds each pair's value once (gpt-oss) or twice (rotate_half's halves)
    angles = torch.atan2(sin[0, :, :n], cos[0, :, :n])
    scales = torch.hypot(sin[0, 0, :n], cos[0, 0, :n])
    return {
        "head_dim": config.head_dim,
        "pairs": [[i, i + n] for i in range(n)],
        "angles": angles.tolist(),
        "scales": scales.tolist(),
    }


def hugging_face(model_type: str) -> dict:
    """Per layer: the rope kind, the mask kind and the softmax kind of Hugging Face's own model."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model_type)
    model = AutoModelForCausalLM.from_config(config)
    layers = range(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or [("sliding" if window else "full") + "_attention"] * len(layers)
    scale = getattr(config, "query_pre_attn_scalar", config.head_dim) ** -0.5
    return {
        "rope": {"positions": list(ROPE_POSITIONS), **per_layer({i: _hf_rope(model, config, i) for i in layers})},
        "mask": per_layer(
            {
                i: {"causal": True, "window": window - 1 if window and types[i] == "sliding_attention" else None}
                for i in layers
            }
        ),
        "softmax": per_layer(
            {
                i: {
                    "scale": scale,
                    "softcap": getattr(config, "attn_logit_softcapping", None),
                    "sinks": "learnable" if model_type == "gpt_oss" else "none",
                }
                for i in layers
            }
        ),
    }


def preview(model_type: str, directory: Path) -> dict:
    """``check``'s training preview (``hosts.behaviour_preview``: the model on the meta device) of the tiny
    config written to ``directory``, in float32 as the model above."""
    from nemo_rl_attn_align.hosts.behaviour_preview import preview as side_preview
    from nemo_rl_attn_align.probe.sides import SideSpec

    hf_config(model_type).save_pretrained(directory)
    model = {"checkpoint": str(directory), "precision": "float32"}
    return side_preview(SideSpec("training", engine="megatron-bridge", model=model))


def main() -> int:
    from nemo_rl_attn_align.hosts import megatron_behaviour

    ensure_model_parallel()
    out = {}
    with tempfile.TemporaryDirectory(prefix="bridge-behaviour-") as scratch:
        for model_type in MODELS:
            fields, problems = megatron_behaviour.read(megatron_model(model_type))
            training = {name: [f.provenance.value, f.value, f.source] for name, f in fields.items()}
            out[model_type] = {
                "training": training,
                "problems": problems,
                "hf": hugging_face(model_type),
                "preview": preview(model_type, Path(scratch) / model_type),
            }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
