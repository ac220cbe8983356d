"""``python -m tests.real_nemo_rl.bridge_behaviour [upstream]``: the behaviour fields the Megatron
worker records (``hosts.megatron_behaviour``) for models Megatron-Bridge builds from tiny configs of
transformers' own config classes, beside what Hugging Face's own model computes for the same config.

Each model is built as NeMo-RL builds it (``AutoBridge.from_hf_config(...).to_megatron_provider(
load_weights=False)``, ``finalize()``, ``provide()``), on the CPU as ``check``'s preview builds one
(``hosts.behaviour_preview.local_attention_spec``): megatron-core imported before the Transformer
Engine stand-in, the local layer spec, fp32, ``cpu_only``. A converter's own attention modules stay
where they build without TE: Gemma 2's core attention (``Gemma2FlexDotProductAttention``) and Gemma
3's self-attention (``Gemma3SelfAttention``, which picks the local or global RoPE) on the local
spec's linear layers; Gemma 3's core attention is Transformer Engine's, so its mask and softmax here
are the local module's, not the converter's. Beside each: ``check``'s preview of the same config
(``preview``), the model built on the meta device.

The reference per layer: the window Hugging Face's ``layer_types`` / ``sliding_window`` give
(``sliding_window - 1`` keys before the query), the scale and soft cap of its attention, and its
rotary module's (cos, sin) at ``ROPE_POSITIONS`` (angles and magnitudes of half-split pairs, as its
``rotate_half`` pairs them). ``upstream`` builds two upstream bugs instead: Megatron-Bridge #2656
re-introduced into the installed Mistral bridge (its ``provider_bridge`` source with
``sliding_window - 1`` made ``sliding_window`` again, executed in the bridge's module), and Gemma 2
with ``attention_backend: local``, under which Megatron-Bridge 0.6.2's ``provide()`` replaces
Gemma 2's own core attention by megatron-core's (no soft cap, every layer windowed). Prints one JSON
line: model -> {"training": {field: [provenance, value, source]}, "problems", "hf": {"rope", "mask",
"softmax"}, "preview": the preview side's answer}.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.hosts.behaviour_preview import cpu_build_settings, local_attention_spec
from nemo_rl_attn_align.probe.bridge_side import import_bridge, set_recipe_settings
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


def revert_2656() -> None:
    """Megatron-Bridge #2656 undone in the installed Mistral bridge: (W, 0) again, W + 1 tokens seen."""
    from megatron.bridge.models.mistral import mistral_bridge

    source = textwrap.dedent(inspect.getsource(mistral_bridge.MistralBridge.provider_bridge))
    assert "hf_config.sliding_window - 1" in source, "the installed Mistral bridge has no #2656 fix to revert"
    namespace: dict[str, Any] = {}
    exec(compile(source.replace("hf_config.sliding_window - 1", "hf_config.sliding_window"), "revert", "exec"),
         vars(mistral_bridge), namespace)  # fmt: skip
    mistral_bridge.MistralBridge.provider_bridge = namespace["provider_bridge"]


def recipe_settings(attention_backend: str | None) -> dict[str, str]:
    """The recipe's precision (float32) and ``megatron_cfg.attention_backend`` where one is given."""
    return {"precision": "float32", **({"attention_backend": attention_backend} if attention_backend else {})}


def megatron_model(model_type: str, attention_backend: str | None = None):
    """The model Megatron-Bridge provides for the tiny config, its weights on the CPU (``attention_backend``:
    as NeMo-RL's ``megatron_cfg.attention_backend`` sets it on the provider); the layer spec as
    ``check``'s preview builds it without TE (``hosts.behaviour_preview``), on a real device."""
    bridge, _ = import_bridge()
    provider = bridge.AutoBridge.from_hf_config(hf_config(model_type)).to_megatron_provider(load_weights=False)
    set_recipe_settings(provider, recipe_settings(attention_backend))
    local_attention_spec(provider)
    cpu_build_settings(provider)
    provider.finalize()
    with cpu_only(), own_nvte_environment():  # Megatron asserts the NVTE variables, then sets them
        return provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)


def preview(model_type: str, attention_backend: str | None, directory: Path) -> dict:
    """``check``'s training preview of the tiny config written to ``directory``: the model built on the
    meta device by ``hosts.behaviour_preview``, in this process."""
    from nemo_rl_attn_align.hosts.behaviour_preview import preview as side_preview
    from nemo_rl_attn_align.probe.sides import SideSpec

    hf_config(model_type).save_pretrained(directory)
    model = {"checkpoint": str(directory), **recipe_settings(attention_backend)}
    return side_preview(SideSpec("training", engine="megatron-bridge", model=model))


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


def main(argv: list[str]) -> int:
    from nemo_rl_attn_align.hosts import megatron_behaviour

    ensure_model_parallel()
    backends: dict[str, str | None] = dict.fromkeys(MODELS)
    if argv == ["upstream"]:
        import_bridge()
        revert_2656()
        backends = {"mistral": None, "gemma2": "local"}
    out = {}
    with tempfile.TemporaryDirectory(prefix="bridge-behaviour-") as scratch:
        for model_type, backend in backends.items():
            fields, problems = megatron_behaviour.read(megatron_model(model_type, backend))
            training = {name: [f.provenance.value, f.value, f.source] for name, f in fields.items()}
            out[model_type] = {
                "training": training,
                "problems": problems,
                "hf": hugging_face(model_type),
                "preview": preview(model_type, backend, Path(scratch) / model_type),
            }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
