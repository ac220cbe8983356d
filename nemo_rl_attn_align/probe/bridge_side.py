"""The training side as NeMo-RL builds it: Megatron-Bridge from a Hugging Face checkpoint.

``python -m nemo_rl_attn_align.probe.bridge_side SIDE_JSON OUT [REFERENCE]`` (engine
``megatron-bridge``). ``model`` in the side file: ``checkpoint`` (the HF checkpoint directory,
NeMo-RL's ``policy.model_name``), ``precision`` (NeMo-RL's ``policy.precision``: ``float32``,
``bfloat16`` or ``float16``; default ``float32``) and any field of the provider Megatron-Bridge
makes (NeMo-RL's ``megatron_cfg`` settings: ``apply_rope_fusion``, ``attention_backend`` by
``AttnBackend`` name, ``rotary_base``, ``softmax_scale``, ...). The model is built as NeMo-RL's
``megatron/setup.py`` and ``community_import.py`` build it: ``AutoBridge.from_hf_pretrained`` ->
``to_megatron_provider(load_weights=True)`` -> the precision and the settings on the provider ->
``finalize()`` -> ``provide_distributed_model(wrap_with_ddp=False)``, the checkpoint's weights
loaded by the bridge. The capture is ``megatron_side.capture_model``'s (one code for both megatron
engines, so a Megatron-Bridge side and a vLLM side on one checkpoint compare stage by stage).

Off a GPU, what cannot run is replaced, and the capture names each replacement
(``settings["substitutions"]``, printed under the probe's table): the CPU stand-in for Transformer
Engine (``te_stand_in.py``, only where TE is absent; megatron-core is imported before it, so
megatron-core itself sees no TE and builds its own modules), megatron-core's local layer spec and
``attention_backend`` ``local`` for TE's, no fused RoPE, no persistent layer norm, no gradient
accumulation fusion, no fused masked softmax (``CPU_SETTINGS``), and ``megatron_side.cpu_only``'s two.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from nemo_rl_attn_align.probe import capture as capture_file
from nemo_rl_attn_align.probe import te_stand_in
from nemo_rl_attn_align.probe.megatron_side import capture_model, cpu_only, ensure_model_parallel
from nemo_rl_attn_align.probe.sides import SideSpec, side_main
from nemo_rl_attn_align.vocab.errors import UsageError

#: ``precision`` -> (bf16, fp16): NeMo-RL's ``_apply_precision_config``.
PRECISIONS = {"float32": (False, False), "bfloat16": (True, False), "float16": (False, True)}
#: Off a GPU, the provider fields that would need Transformer Engine, apex or CUDA, and what runs instead.
CPU_SETTINGS = {
    "attention_backend": "local",
    "apply_rope_fusion": False,
    "persist_layer_norm": False,
    "gradient_accumulation_fusion": False,
    "masked_softmax_fusion": False,  # megatron-core's CUDA extension, called in half precision
}
#: megatron-core modules imported before the Transformer Engine stand-in, so that none of them
#: takes the stand-in for TE (each decides ``HAVE_TE`` when it is first imported).
MEGATRON_CORE_FIRST = (
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.experimental_attention_variant_module_specs",
    "megatron.core.transformer.transformer_block",
    "megatron.core.transformer.mlp",
    "megatron.core.tensor_parallel",
    "megatron.core.fp8_utils",
    "megatron.core.fp4_utils",
)


def import_bridge() -> tuple[Any, list[str]]:
    """``megatron.bridge``, imported after megatron-core (and after the TE stand-in where TE is
    absent); what was stood in."""
    for name in MEGATRON_CORE_FIRST:
        importlib.import_module(name)
    stood_in = [te_stand_in.NAME] if te_stand_in.install_if_absent() else []
    bridge = importlib.import_module("megatron.bridge")
    if stood_in:
        took = [m for m, module in list(sys.modules.items()) if m.startswith("megatron.core") and _has_te(module)]
        if took:
            raise RuntimeError(f"megatron-core took the {te_stand_in.NAME} for TE in {', '.join(sorted(took))}")
    return bridge, stood_in


def _has_te(module: Any) -> bool:
    return getattr(module, "HAVE_TE", None) is True


def provider_for(spec: SideSpec) -> tuple[Any, list[str]]:
    """The checkpoint's provider with the side's precision and settings (and, off a GPU, the CPU
    replacements), finalized; the names of what was replaced."""
    import torch

    bridge, named = import_bridge()
    settings = dict(spec.model)
    checkpoint, precision = settings.pop("checkpoint"), settings.pop("precision", "float32")
    provider = bridge.AutoBridge.from_hf_pretrained(checkpoint).to_megatron_provider(load_weights=True)
    provider.bf16, provider.fp16 = PRECISIONS[precision]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    provider.params_dtype = provider.pipeline_dtype = dtype
    for key, value in settings.items():
        _set(provider, key, value)
    if not torch.cuda.is_available():
        named += _cpu_settings(provider)
    provider.finalize()
    return provider, named


def _set(provider: Any, key: str, value: Any) -> None:
    """One provider field, as NeMo-RL sets it from ``megatron_cfg`` (``attention_backend`` by name)."""
    from megatron.core.transformer.enums import AttnBackend

    if not hasattr(provider, key):
        raise UsageError(
            f"model.{key}={value!r}: {type(provider).__name__} has no field {key!r}; give the checkpoint, "
            "precision and provider (TransformerConfig) fields"
        )
    if key == "attention_backend":
        if value not in AttnBackend.__members__:
            raise UsageError(f"model.attention_backend={value!r}: use one of {', '.join(AttnBackend.__members__)}")
        value = AttnBackend[value]
    setattr(provider, key, value)


def _cpu_settings(provider: Any) -> list[str]:
    """Off a GPU: the local layer spec and ``CPU_SETTINGS`` on ``provider``; each change named."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    named = []
    spec = getattr(provider.transformer_layer_spec, "__name__", type(provider.transformer_layer_spec).__name__)
    if provider.transformer_layer_spec is not local_layer_spec:
        provider.transformer_layer_spec = local_layer_spec
        named.append(f"transformer_layer_spec: local_layer_spec (was {spec})")
    for key, value in CPU_SETTINGS.items():
        was = getattr(provider, key)
        _set(provider, key, value)
        if getattr(provider, key) != was:
            named.append(f"{key}: {value} (was {getattr(was, 'name', was)})")
    return named


def build(spec: SideSpec) -> tuple[Any, list[str]]:
    """The side's GPTModel with the checkpoint's weights, in eval mode (its wrapper where the
    precision adds one); the names of what was replaced to build it here."""
    import torch

    ensure_model_parallel()
    provider, named = provider_for(spec)
    with cpu_only():
        [model] = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=not torch.cuda.is_available()
        )
    return model.eval(), named


def capture(spec: SideSpec, reference: capture_file.Capture | None = None) -> capture_file.Capture:
    """The capture of ``spec``'s Megatron-Bridge model over ``spec.sequences``."""
    model, named = build(spec)
    return capture_model(model, spec, reference, tuple(named))


if __name__ == "__main__":
    sys.exit(side_main(capture, sys.argv[1:]))
