"""What a built Megatron model's attention layers compute: the behaviour fields ``rope``, ``mask`` and
``softmax`` (``vocab.behaviour``), read from the live modules once the model is built.

``read(model)`` takes the model as NeMo-RL's worker holds it (a module or a list of model chunks,
each possibly wrapped in DDP / ``Float16Module``) and reads every attention layer of each chunk's
``decoder.layers``, numbered ``layer_number - 1`` (megatron-core's global numbering):

* ``rope``: the rotary module the layer's attention is given (``GPTModel.rotary_pos_emb``; Megatron-
  Bridge's Gemma 3 local or global one, as ``Gemma3SelfAttention`` picks it), evaluated by its own
  ``get_emb`` at each position and applied by megatron-core's ``apply_rotary_pos_emb`` with the
  layer's own config and the YaRN concentration factor the layer passes, on the one-hot basis
  (``behaviour_probe``). The module is never changed: ``get_emb`` runs on a shallow copy (it moves
  ``inv_freq`` to the GPU, as the first forward would; off a GPU ``probe.megatron_side.cpu_only``
  answers the CPU), and no cached ``forward`` is called. With ``apply_rope_fusion`` (or
  ``fused_single_qkv_rope``) on, the unfused function is what is evaluated and the source says so:
  the fused kernel is recorded as ``rope_fusion``. Layers ``no_rope_freq`` skips have no rotary.
* ``mask`` and ``softmax``: what the module that runs the kernel holds
  (``self_attention.core_attention``): Transformer Engine's ``DotProductAttention`` (``window_size``,
  ``attn_mask_type``, ``softmax_scale``, ``softcap``, ``softmax_type``), megatron-core's local
  ``DotProductAttention`` (``scale_mask_softmax.window_size``, ``softmax_scale``, ``softmax_offset``)
  or Megatron-Bridge's Gemma 2 module (``window_size``, ``softcap`` / ``norm_factor``); never the
  ``TransformerConfig``, which a converter's module may override per layer.

A field a layer cannot be read for is unobservable with the reason (``NotReadable``); any other
failure is also a problem the hook notes. Multi-latent attention's rotary (applied inside its own
projection) is not evaluated.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.hosts.behaviour_probe import NotARotation, no_rotation, rope_value, rotation_kind
from nemo_rl_attn_align.model.model_attention import layer_ranges
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS, ROPE_POSITIONS, per_layer
from nemo_rl_attn_align.vocab.schema import field_spec

#: Where megatron-core's attention forward resolves ``apply_rotary_pos_emb`` and the YaRN factor
#: (Megatron-Bridge patches the latter there).
ATTENTION_MODULE = "megatron.core.transformer.attention"


class NotReadable(Exception):
    """A layer's behaviour this reader cannot read (the field is unobservable with this reason)."""


@dataclass(frozen=True)
class AttentionLayer:
    """One attention layer of a model chunk: its 0-based index, its attention module, the chunk."""

    index: int
    attention: Any
    chunk: Any

    @property
    def path(self) -> str:
        return f"decoder.layers[{self.index}].self_attention"


def attention_layers(model: Any) -> list[AttentionLayer]:
    """Every attention layer of ``model`` (a module or model chunks, wrapped or not), by index."""
    layers = []
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        inner = _unwrapped(chunk)
        for layer in getattr(getattr(inner, "decoder", None), "layers", ()):
            attention = getattr(layer, "self_attention", None)
            if hasattr(attention, "core_attention"):
                layers.append(AttentionLayer(int(layer.layer_number) - 1, attention, inner))
    if not layers:
        raise NotReadable(f"{type(model).__name__} has no decoder.layers[*].self_attention.core_attention")
    return sorted(layers, key=lambda layer: layer.index)


def _unwrapped(module: Any) -> Any:
    """The model inside DDP / ``Float16Module`` wrappers (each keeps it as ``.module``)."""
    for _ in range(8):
        if hasattr(module, "decoder") or not hasattr(module, "module"):
            return module
        module = module.module
    return module


def _class_names(module: Any) -> list[str]:
    return [cls.__name__ for cls in type(module).__mro__]


def _held(module: Any, name: str) -> Any:
    """``module.name``, which the module must hold (else ``NotReadable`` naming it)."""
    if not hasattr(module, name):
        raise NotReadable(f"{type(module).__name__} holds no {name}")
    return getattr(module, name)


def _is_te(module: Any) -> bool:
    return any(
        cls.__name__ == "DotProductAttention" and cls.__module__.startswith("transformer_engine.")
        for cls in type(module).__mro__
    )


# --- rope ----------------------------------------------------------------------------------------


def _rotary_of(layer: AttentionLayer) -> tuple[Any, str]:
    """The rotary module this layer's attention is given, and its name (None: no rotary)."""
    config = layer.attention.config
    skip = getattr(config, "no_rope_freq", None)
    if skip and skip[layer.index]:
        return None, f"no rotary (no_rope_freq[{layer.index}])"
    rotary = getattr(layer.chunk, "rotary_pos_emb", None)
    if rotary is None:
        kind = getattr(layer.chunk, "position_embedding_type", None)
        return None, f"no rotary (position_embedding_type {kind})"
    if hasattr(rotary, "rope_local"):  # Megatron-Bridge's Gemma 3: (local, global) stacked
        if "Gemma3SelfAttention" not in _class_names(layer.attention):
            raise NotReadable(
                f"{type(rotary).__name__} gives two embeddings; {type(layer.attention).__name__} picks one"
            )
        is_local = getattr(sys.modules[type(layer.attention).__module__], "_is_local_attn_layer", None)
        if is_local is None:
            raise NotReadable(f"{type(layer.attention).__module__} has no _is_local_attn_layer")
        if is_local(layer.attention.layer_number, config.interleaved_attn_pattern):
            return rotary.rope_local, f"rotary_pos_emb.rope_local ({type(rotary).__name__}, local layer)"
        return rotary, f"rotary_pos_emb ({type(rotary).__name__}, global layer)"
    if not hasattr(rotary, "get_emb") or type(rotary).__name__ == "MultimodalRotaryEmbedding":
        raise NotReadable(f"{type(rotary).__name__} rotates by per-token position ids (not evaluated)")
    return rotary, f"rotary_pos_emb ({type(rotary).__name__})"


def _angles(rotary: Any, positions: tuple[int, ...]) -> Any:
    """``[len(positions), 1, 1, rotary_dim]``: the rotary's own ``get_emb`` at each position, on a copy."""
    import torch

    from nemo_rl_attn_align.probe.megatron_side import cpu_only

    twin = copy.copy(rotary)  # get_emb moves inv_freq to the GPU: on the copy only
    with cpu_only(), torch.no_grad():
        rows = [twin.get_emb(1, offset=p) for p in positions]
    return torch.cat([row[0] if isinstance(row, tuple) else row for row in rows])  # YaRN: (emb, mscale)


def _yarn_factor(attention: Any) -> float:
    """The concentration factor the layer passes as ``mscale`` (megatron-core 0.19 caches it)."""
    cached = getattr(attention, "_yarn_concentration_factor", None)
    if cached is not None:
        return float(cached)
    return float(sys.modules[ATTENTION_MODULE]._yarn_get_concentration_factor_from_config(attention.config))


def _rope_reader() -> Callable[[AttentionLayer], tuple[dict, str]]:
    """Reads one layer's rope kind; equal inputs (rotary module, config, mscale) are evaluated once."""
    import importlib

    import torch

    attention_module = importlib.import_module(ATTENTION_MODULE)
    angles: dict[int, Any] = {}
    kinds: dict[tuple, dict] = {}

    def read(layer: AttentionLayer) -> tuple[dict, str]:
        attention, config = layer.attention, layer.attention.config
        head_dim = int(attention.hidden_size_per_attention_head)
        if getattr(config, "multi_latent_attention", False):
            raise NotReadable("multi-latent attention applies its rotary in its own projection (not evaluated)")
        rotary, name = _rotary_of(layer)
        if rotary is None:
            return no_rotation(head_dim, ROPE_POSITIONS), name
        mscale = _yarn_factor(attention)
        fused = [f for f in ("apply_rope_fusion", "fused_single_qkv_rope") if getattr(config, f, False)]
        how = f"the model's {name}.get_emb, applied by apply_rotary_pos_emb(config=the layer's, mscale={mscale:g})"
        if fused:
            how += f", unfused ({' and '.join(fused)} on: the fused kernel is rope_fusion's)"
        key = (id(rotary), id(config), mscale, head_dim)
        if key not in kinds:
            if id(rotary) not in angles:
                angles[id(rotary)] = _angles(rotary, ROPE_POSITIONS)
            freqs = angles[id(rotary)]
            unfused = copy.copy(config)
            unfused.apply_rope_fusion = False
            cp_group = getattr(getattr(attention, "pg_collection", None), "cp", None)

            def apply(basis: Any, positions: Any) -> Any:
                # basis [positions, d, d] as megatron's [seq, batch, heads=1, head_dim]
                out = attention_module.apply_rotary_pos_emb(
                    basis.unsqueeze(2), freqs.to(basis.device), config=unfused, mscale=mscale, cp_group=cp_group
                )
                return out.squeeze(2)

            with torch.no_grad():
                try:
                    kinds[key] = rotation_kind(apply, head_dim, ROPE_POSITIONS, freqs.device)
                except NotARotation as err:
                    raise NotReadable(f"{name}: {err}") from err
        return kinds[key], how

    return read


# --- mask and softmax ----------------------------------------------------------------------------


def _mask_kind(window: Any, causal: bool, what: str) -> dict[str, Any]:
    """``{"causal", "window"}`` from a kernel's inclusive ``(left, right)`` window (None/-1: none)."""
    if window is None:
        return {"causal": causal, "window": None}
    if not isinstance(window, (list, tuple)) or len(window) != 2:
        raise NotReadable(f"{what} {window!r} is not a (left, right) window")
    left, right = (int(w) for w in window)
    if causal and right not in (0, -1):
        raise NotReadable(f"{what} {tuple(window)}: a causal mask with a right window")
    if not causal and left >= 0:
        raise NotReadable(f"{what} {tuple(window)}: a window without a causal mask is not a causal window")
    return {"causal": causal, "window": left if left >= 0 else None}


def _causal(mask_type: Any) -> bool:
    """Whether a mask type (TE's string, megatron-core's ``AttnMaskType``) is causal."""
    return "causal" in str(getattr(mask_type, "name", mask_type))


def _te_mask(core: Any) -> tuple[dict, str]:
    mask_type = _held(core, "attn_mask_type")
    kind = _mask_kind(_held(core, "window_size"), _causal(mask_type), f"{type(core).__name__}.window_size")
    return kind, f"{type(core).__name__}.window_size/attn_mask_type ({mask_type})"


def _local_mask(core: Any) -> tuple[dict, str]:
    window = _held(_held(core, "scale_mask_softmax"), "window_size")
    causal = window is not None or _causal(_held(core, "attn_mask_type"))
    kind = _mask_kind(window, causal, "scale_mask_softmax.window_size")
    return kind, f"{type(core).__name__}.scale_mask_softmax.window_size/attn_mask_type"


def _gemma2_mask(core: Any) -> tuple[dict, str]:
    # Its sliding-window mask (get_swa, or the Flex block mask) is causal; other layers are plain causal.
    window = _held(core, "window_size")
    causal = window is not None or _causal(_held(core, "attn_mask_type"))
    return _mask_kind(window, causal, "window_size"), f"{type(core).__name__}.window_size"


def _sinks(core: Any) -> str:
    """TE's ``softmax_type`` where it holds one, else what ``softmax_offset`` is (local module)."""
    import torch

    kind = getattr(core, "softmax_type", None)
    if kind is not None:
        return "none" if kind == "vanilla" else str(kind)
    offset = getattr(core, "softmax_offset", None)
    return "none" if offset is None else "learnable" if isinstance(offset, torch.nn.Parameter) else "off-by-one"


def _softmax_kind(scale: Any, softcap: Any, core: Any) -> dict[str, Any]:
    return {"scale": float(scale), "softcap": float(softcap) if softcap else None, "sinks": _sinks(core)}


#: Transformer Engine's kernel modules inside its ``DotProductAttention``; before TE 2.15 only they
#: hold the softmax scale.
TE_KERNELS = ("flash_attention", "fused_attention", "unfused_attention")


def _te_softmax(core: Any) -> tuple[dict, str]:
    """TE's scale (on the module, else on its kernel modules, which must agree), soft cap (none before
    TE had one), sinks."""
    name = type(core).__name__
    if hasattr(core, "softmax_scale"):
        scale, where = core.softmax_scale, f"{name}.softmax_scale"
    else:
        held = (getattr(getattr(core, k, None), "softmax_scale", None) for k in TE_KERNELS)
        scales = {float(scale) for scale in held if scale is not None}
        if len(scales) != 1:
            raise NotReadable(f"{name}'s kernel modules hold softmax scales {sorted(scales)}")
        [scale], where = scales, f"{name}.{{{','.join(TE_KERNELS)}}}.softmax_scale"
    kind = _softmax_kind(scale, getattr(core, "softcap", None), core)
    return kind, f"{where}/softcap/softmax_type"


def _local_softmax(core: Any) -> tuple[dict, str]:
    coeff = _held(_held(core, "scale_mask_softmax"), "scale") or 1.0  # query-key layer scaling
    kind = _softmax_kind(_held(core, "softmax_scale") * coeff, None, core)
    return kind, f"{type(core).__name__}.softmax_scale x scale_mask_softmax.scale/softmax_offset"


def _gemma2_softmax(core: Any) -> tuple[dict, str]:
    if hasattr(core, "softcap"):  # Gemma2FlexDotProductAttention: what its fused kernel is given
        kind = _softmax_kind(_held(core, "softmax_scale"), core.softcap, core)
        return kind, f"{type(core).__name__}.softmax_scale/softcap"
    coeff = _held(_held(core, "scale_mask_softmax"), "scale") or 1.0
    kind = _softmax_kind(coeff / _held(core, "norm_factor"), core.config.attn_logit_softcapping, core)
    return kind, f"{type(core).__name__}.norm_factor/config.attn_logit_softcapping"


#: Core-attention readers by the class (in the module's MRO) they read: (mask, softmax).
_CORE_READERS: dict[str, tuple[Callable[[Any], tuple[dict, str]], Callable[[Any], tuple[dict, str]]]] = {
    "Gemma2DotProductAttention": (_gemma2_mask, _gemma2_softmax),
    "DotProductAttention": (_local_mask, _local_softmax),
}


def core_kind(core: Any, index: int) -> tuple[dict, str]:
    """The mask (``index`` 0) or softmax (1) kind a core-attention module holds, and where it was read;
    ``NotReadable`` for a module no reader knows (also ``hosts.model_readers``' reading of a provider's own)."""
    if _is_te(core):
        return (_te_mask, _te_softmax)[index](core)
    for name in _class_names(core):
        if name in _CORE_READERS:
            return _CORE_READERS[name][index](core)
    raise NotReadable(f"{type(core).__module__}.{type(core).__name__}: no reader for this core attention")


def _core_reader(index: int) -> Callable[[AttentionLayer], tuple[dict, str]]:
    def read(layer: AttentionLayer) -> tuple[dict, str]:
        return core_kind(layer.attention.core_attention, index)

    return read


# --- the three fields ----------------------------------------------------------------------------


def _field(layers: list[AttentionLayer], reader: Callable[[AttentionLayer], tuple[dict, str]], field: str) -> Any:
    """The field's value from each layer's kind, and a source grouping the layers by how each was read."""
    kinds: dict[int, dict] = {}
    how: dict[str, list[int]] = {}
    for layer in layers:
        try:
            kinds[layer.index], read = reader(layer)
        except NotReadable as err:
            raise NotReadable(f"{layer.path}: {err}") from err
        how.setdefault(read, []).append(layer.index)
    where = "self_attention" if field == "rope" else "self_attention.core_attention"
    source = "; ".join(f"{read} of decoder.layers[{layer_ranges(idx)}].{where}" for read, idx in how.items())
    if field == "rope":
        return rope_value(kinds, ROPE_POSITIONS), f"{source}, at positions {list(ROPE_POSITIONS)}"
    return per_layer(kinds), source


#: Each field's reader of one layer, made once per read (the rope reader keeps what it evaluated).
_READERS: dict[str, Callable[[], Callable[[AttentionLayer], tuple[dict, str]]]] = {
    "rope": _rope_reader,
    "mask": lambda: _core_reader(0),
    "softmax": lambda: _core_reader(1),
}


def read(model: Any) -> tuple[dict[str, FieldValue], list[str]]:
    """The three behaviour fields of ``model`` (observed, or unobservable with the reason), and the
    problems to note: failures other than a layer this reader cannot read."""
    fields: dict[str, FieldValue] = {}
    problems: list[str] = []
    for field in BEHAVIOUR_FIELDS:
        try:
            value, source = _field(attention_layers(model), _READERS[field](), field)
            fields[field] = FieldValue.observed(field_spec(field).validate(value), source)
        except NotReadable as err:
            fields[field] = FieldValue.unobservable(None, str(err))
        except Exception as err:  # observability: never breaks the worker
            why = f"reading the {field} behaviour failed: {type(err).__name__}: {err}"
            fields[field] = FieldValue.unobservable(None, why)
            problems.append(why)
    return fields, problems
