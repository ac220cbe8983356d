"""Build a Gemma model as NeMo-RL builds it and read each layer's own core-attention module.

``python -m tests.real_nemo_rl.own_attention_probe MODEL_DIR [--before-4875]`` (its facts: JSON, the last line)

Run by ``test_architecture_table.py`` in a process of its own, the lane's Transformer Engine
stand-in loaded first (megatron-core then builds the provider's TE-based attention). The model is
built through NeMo-RL's path (``AutoBridge.from_hf_config`` -> ``to_megatron_provider
(load_weights=False)`` -> ``finalize()`` -> ``provide_distributed_model(wrap_with_ddp=False)``) on
a CPU in float32, with the provider's own layer spec except
Transformer Engine's linear and norm modules, which the stand-in cannot build (``LOCAL_MODULES``:
megatron-core's own linear layers, no norms) and with the probe's CPU settings (``CPU_SETTINGS``);
the core attention is the provider's own, and TE's CPU offloading (off in NeMo-RL) is none. Written
for each decoder layer: the left window, softmax scale and logit soft cap its core-attention module
holds (Gemma 2's module: its ``window_size`` / ``softmax_scale`` / ``softcap``; one built on TE's
``DotProductAttention``: the window megatron-core hands TE, by ``is_layer_window_attention`` on
the module's own config, and the scale ``SelfAttention`` hands it; TE has no soft cap), and the
plugin's reader's view of the same config (``hosts.model_readers.read_megatron``).
``--before-4875`` first re-introduces Megatron-Bridge #4875's bug in a copy of the installed
``gemma2_provider`` (Gemma 2's window on ``layer_number % 2 == 0``), whose attention classes then
replace the installed ones in this process. It records facts only; the tests judge them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.probe import bridge_side

#: What replaces Transformer Engine's modules in the provider's own layer spec, by submodule name.
LOCAL_MODULES = {"linear_qkv": "column", "linear_fc1": "column", "linear_proj": "row", "linear_fc2": "row",
                 "q_layernorm": "identity", "k_layernorm": "identity"}  # fmt: skip
#: The probe's Megatron-Bridge side's CPU settings, except its attention backend: ``local`` would
#: replace the provider's own core attention with megatron-core's (``GPTModelProvider.provide``).
CPU_SETTINGS = {key: value for key, value in bridge_side.CPU_SETTINGS.items() if key != "attention_backend"}
#: Megatron-Bridge #4875's fix in ``gemma2_provider.Gemma2DotProductAttention.__init__``, and its revert.
FIX_4875 = ("if self.layer_number % 2 == 1:", "if self.layer_number % 2 == 0:")


def revert_4875() -> None:
    """Gemma 2's attention classes from a copy of the installed module with #4875 reverted."""
    from megatron.bridge.models.gemma import gemma2_provider

    source = Path(gemma2_provider.__file__).read_text()
    fixed, buggy = FIX_4875
    if source.count(fixed) != 1:
        raise SystemExit(f"{gemma2_provider.__file__} does not hold #4875's line {fixed!r} once")
    copy = types.ModuleType("gemma2_provider_before_4875")
    copy.__file__ = gemma2_provider.__file__
    sys.modules[copy.__name__] = copy  # its dataclasses look their module up
    exec(compile(source.replace(fixed, buggy), copy.__file__, "exec"), copy.__dict__)
    for name in ("Gemma2DotProductAttention", "Gemma2FlexDotProductAttention"):
        setattr(gemma2_provider, name, getattr(copy, name))


def with_local_modules(spec: Any) -> Any:
    """``spec`` with ``LOCAL_MODULES`` in place of Transformer Engine's, recursively."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    local = {"column": ColumnParallelLinear, "row": RowParallelLinear, "identity": IdentityOp}
    if not isinstance(spec, ModuleSpec) or spec.submodules is None:
        return spec
    changes = {}
    for field in dataclasses.fields(spec.submodules):
        value = getattr(spec.submodules, field.name)
        from_te = isinstance(value, type) and (
            "transformer_engine" in value.__module__ or "te_layers" in value.__module__
        )
        if field.name in LOCAL_MODULES and from_te:
            changes[field.name] = local[LOCAL_MODULES[field.name]]
        elif isinstance(value, ModuleSpec):
            changes[field.name] = with_local_modules(value)
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, **changes))


def build(model_dir: str) -> Any:
    """The model NeMo-RL's path builds from ``model_dir``'s config.json, on a CPU in float32."""
    import torch
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel

    ensure_model_parallel()
    bridge = AutoBridge.from_hf_config(AutoConfig.from_pretrained(model_dir))
    provider = bridge.to_megatron_provider(load_weights=False)
    own_spec = provider.transformer_layer_spec
    provider.transformer_layer_spec = lambda config: with_local_modules(own_spec(config))
    provider.bf16, provider.fp16, provider.params_dtype = False, False, torch.float32
    for key, value in CPU_SETTINGS.items():
        setattr(provider, key, value)
    provider.finalize()
    with cpu_only():
        [model] = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    return model


def layer_facts(attention: Any) -> dict[str, Any]:
    """One decoder layer's ``SelfAttention``: what its core-attention module attends with."""
    from megatron.core.extensions.transformer_engine import TEDotProductAttention
    from megatron.core.transformer.utils import is_layer_window_attention

    core = attention.core_attention
    if isinstance(core, TEDotProductAttention):
        config = core.config
        windowed = is_layer_window_attention(config.window_size, config.window_attn_skip_freq, attention.layer_number)
        scale = attention.config.softmax_scale or 1.0 / math.sqrt(attention.config.kv_channels)
        window, cap = (config.window_size if windowed else None), 0.0
    else:
        window, scale, cap = core.window_size, core.softmax_scale, core.softcap
    return {
        "module": type(core).__name__,
        "layer_number": attention.layer_number,
        "window": None if window is None else window[0],
        "softmax_scale": scale,
        "softcap": cap,
    }


def main(argv: list[str]) -> int:
    model_dir, *flags = argv
    sys.path.insert(0, str(Path(__file__).parent / "stand_ins"))
    import attn_align_stand_ins  # noqa: F401  (Transformer Engine's stand-in, before megatron-core)
    from megatron.core.transformer import transformer_block

    transformer_block.get_cpu_offload_context = None  # TE's CPU offloading (off in NeMo-RL): none here
    if "--before-4875" in flags:
        revert_4875()
    from nemo_rl_attn_align.hosts.model_readers import read_megatron

    model = build(model_dir)
    facts = {
        "layers": [layer_facts(layer.self_attention) for layer in model.decoder.layers],
        "reader": read_megatron(model_dir),
    }
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
