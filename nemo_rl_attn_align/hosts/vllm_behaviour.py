"""What a live vLLM engine's attention layers compute: the behaviour fields ``rope``, ``mask`` and
``softmax`` (``vocab.behaviour``), read once after warm-up by the rollout hook (``hosts.vllm_worker``).

The attention layers are the softmax attention modules of ``static_forward_context`` (by layer index,
as ``attention_layers`` numbers them); the module that holds each one (``model.layers.<i>.self_attn``,
gpt-oss's ``.attn``) is found by name among the model's modules.

* ``rope``: the holder's ``rotary_emb`` (None: a layer without rotary embedding), evaluated as the
  module computes it, in float32: its own ``_compute_cos_sin_cache()`` (YaRN's correction band and
  mscale, linear scaling, ... included) on the device of its cache, then its own ``forward_native``
  (rotary_dim, is_neox_style, head_size as the module holds them) on one-hot vectors, through
  ``hosts.behaviour_probe``. Both run on a shallow copy whose ``cos_sin_cache`` is that float32
  cache: the live module is left as it is. Positions of ``ROPE_POSITIONS`` past the shortest cache
  are not evaluated (the source names them); each distinct module is evaluated once (``get_rope``
  shares one module between equal layers).
* ``mask``: the impl's ``sliding_window`` as the kernel receives it (``vllm_snapshot.impl_left_window``)
  and the layer's ``attn_type`` (decoder self-attention: causal).
* ``softmax``: ``impl.scale``, ``impl.logits_soft_cap`` (0 or None: none), sinks (``impl.sinks`` or
  the holder's ``sinks`` parameter: learnable).

A layer a field cannot be read from makes that field unobservable with the reason, never guessed; an
unexpected failure is also a problem ``read_behaviour`` returns for the hook to note. Cost: one
cos/sin cache and one small batched evaluation per distinct rotary module, nothing per step
(``benchmarks/vllm_behaviour.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.contract.vllm_snapshot import impl_left_window, impl_soft_cap
from nemo_rl_attn_align.hosts.behaviour_probe import NotARotation, no_rotation, rope_value, rotation_kind
from nemo_rl_attn_align.model.model_attention import is_attention_module, layer_index
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS, ROPE_POSITIONS, mask, per_layer, softmax
from nemo_rl_attn_align.vocab.kinds import ContractError

#: vLLM's ``AttentionType`` values: only decoder self-attention is causal.
ATTENTION_TYPES = {"decoder": True, "encoder": False, "encoder_only": False, "encoder_decoder": False}


class Unreadable(Exception):
    """A layer does not show what a field needs (the field is unobservable, with this reason)."""


class AttentionLayer:
    """One attention layer: its index, its name, vLLM's ``Attention`` module and the module holding it."""

    def __init__(self, index: int, name: str, layer: Any, holder: Any):
        self.index, self.name, self.layer, self.holder = index, name, layer, holder

    def impl(self) -> Any:
        impl = getattr(self.layer, "impl", None)
        if impl is None:
            raise Unreadable(f"{self.name} has no impl")
        return impl


def attention_layers(static_forward_context: Mapping[str, Any], modules: Mapping[str, Any]) -> list[AttentionLayer]:
    """The softmax attention layers of ``static_forward_context`` by index, the first of each index."""
    found: dict[int, AttentionLayer] = {}
    for name, layer in (static_forward_context or {}).items():
        index = layer_index(name)
        if index is not None and index not in found and is_attention_module(layer):
            found[index] = AttentionLayer(index, name, layer, modules.get(name.rpartition(".")[0]))
    return [found[index] for index in sorted(found)]


# --- rope ----------------------------------------------------------------------------------------


def _probe(rotary: Any) -> Any:
    """A shallow copy of ``rotary`` holding its own cos/sin cache recomputed in float32 (by the copy's
    ``_compute_cos_sin_cache()``, on the device of the cache the module holds; on the CPU for a model
    built on the meta device, ``check``'s preview): the live module, its attributes and its buffers
    stay as they are."""
    if not callable(getattr(rotary, "_compute_cos_sin_cache", None)) or not callable(
        getattr(rotary, "forward_native", None)
    ):
        raise Unreadable(f"{type(rotary).__name__} has no _compute_cos_sin_cache / forward_native to evaluate")
    head_size = getattr(rotary, "head_size", None)
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size <= 0:
        raise Unreadable(f"{type(rotary).__name__} has no integer head_size")
    if len(getattr(rotary, "scaling_factors", ())) > 1:  # LinearScalingRotaryEmbedding for several LoRAs
        raise Unreadable(f"{type(rotary).__name__} holds one cache per scaling factor {rotary.scaling_factors}")
    probe = copy.copy(rotary)
    held = getattr(rotary, "cos_sin_cache", None)
    device = held.device if isinstance(held, torch.Tensor) else None
    with torch.device(device if device is not None and device.type != "meta" else "cpu"):  # meta: no values
        cache = probe._compute_cos_sin_cache()
    if not isinstance(cache, torch.Tensor) or cache.dim() != 2:
        raise Unreadable(f"{type(rotary).__name__}._compute_cos_sin_cache() gave no [positions, dims] tensor")
    probe.__dict__["_buffers"] = {**rotary._buffers, "cos_sin_cache": cache.float()}
    return probe


def _rotation(probe: Any, positions: Sequence[int]) -> dict[str, Any]:
    """The rope kind of the module's own ``forward_native`` (on its ``_probe``) at ``positions``."""
    head_size, cache = probe.head_size, probe.cos_sin_cache

    def apply(basis: torch.Tensor, at: Sequence[int]) -> torch.Tensor:
        # one token per position, head_size "heads" per token: head a is the one-hot vector of channel a;
        # the key (some classes require one) is one head per token, rotated alike and dropped
        query = basis.reshape(len(at), head_size * head_size)
        key = query[:, :head_size].clone()
        with torch.no_grad():
            rotated, _ = probe.forward_native(torch.tensor(at, device=cache.device), query, key)
        return rotated.reshape(len(at), head_size, head_size)

    return rotation_kind(apply, head_size, positions, cache.device)


def _head_size(layer: AttentionLayer) -> int:
    """The head size of a layer without rotary embedding (its NoPE kind's ``head_dim``)."""
    head_size = getattr(layer.layer, "head_size", None)
    if isinstance(head_size, bool) or not isinstance(head_size, int):
        raise Unreadable(f"{layer.name} has no rotary_emb and no integer head_size")
    return head_size


def read_rope(layers: Sequence[AttentionLayer]) -> FieldValue:
    """Each layer's rotary embedding, evaluated at the positions every layer's cache serves."""
    rotaries: dict[int, Any] = {}  # id -> module (layers sharing one module are evaluated once)
    for layer in layers:
        if layer.holder is None:
            raise Unreadable(f"the module holding {layer.name} is not among the model's modules")
        if not hasattr(layer.holder, "rotary_emb"):
            raise Unreadable(f"{type(layer.holder).__name__} holding {layer.name} has no rotary_emb")
        if layer.holder.rotary_emb is not None:
            rotaries.setdefault(id(layer.holder.rotary_emb), layer.holder.rotary_emb)
    probes = {key: _probe(rotary) for key, rotary in rotaries.items()}
    served = min((probe.cos_sin_cache.shape[0] for probe in probes.values()), default=max(ROPE_POSITIONS) + 1)
    positions = [p for p in ROPE_POSITIONS if p < served]
    if not positions:
        raise Unreadable(f"the cos_sin_cache holds {served} positions, below every position of {ROPE_POSITIONS}")
    kinds = {key: _rotation(probe, positions) for key, probe in probes.items()}
    by_layer = {}
    for layer in layers:
        rotary = layer.holder.rotary_emb
        by_layer[layer.index] = kinds[id(rotary)] if rotary is not None else no_rotation(_head_size(layer), positions)
    classes = sorted({type(rotary).__name__ for rotary in rotaries.values()})
    source = (
        f"each attention layer's rotary_emb ({', '.join(classes) or 'none'}): _compute_cos_sin_cache() and "
        "forward_native in float32 on one-hot vectors"
    )
    cut = [p for p in ROPE_POSITIONS if p >= served]
    if cut:
        source += (
            f"; positions {', '.join(map(str, cut))} not evaluated: past the {served} positions of the cos_sin_cache"
        )
    return FieldValue.observed(rope_value(by_layer, positions), source)


# --- mask and softmax ----------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """An enum's value (vLLM's ``AttentionType`` is a ``str`` enum), else the value."""
    return getattr(value, "value", value)


def _mask_kind(layer: AttentionLayer) -> dict[str, Any]:
    impl = layer.impl()
    attn_type = _plain(getattr(layer.layer, "attn_type", getattr(impl, "attn_type", None)))
    if attn_type not in ATTENTION_TYPES:
        raise Unreadable(f"{layer.name} has attn_type {attn_type!r}, not one of {sorted(ATTENTION_TYPES)}")
    if not hasattr(impl, "sliding_window"):
        raise Unreadable(f"{layer.name}'s {type(impl).__name__} has no sliding_window")
    readable, window = impl_left_window(impl.sliding_window)
    if not readable:
        raise Unreadable(f"{layer.name}'s impl.sliding_window {impl.sliding_window!r} is neither a pair nor an int")
    return {"causal": ATTENTION_TYPES[attn_type], "window": window}


def _softmax_kind(layer: AttentionLayer) -> dict[str, Any]:
    impl = layer.impl()
    scale = getattr(impl, "scale", None)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise Unreadable(f"{layer.name}'s {type(impl).__name__} has no numeric scale")
    sinks = getattr(impl, "sinks", None) is not None or isinstance(getattr(layer.holder, "sinks", None), torch.Tensor)
    return {
        "scale": float(scale),
        "softcap": impl_soft_cap(getattr(impl, "logits_soft_cap", None)),
        "sinks": "learnable" if sinks else "none",
    }


Reader = Callable[[Sequence[AttentionLayer]], FieldValue]


def _each_layer(kind_of: Callable[[AttentionLayer], dict[str, Any]], check: Callable, source: str) -> Reader:
    """A field read layer by layer with ``kind_of``, checked by ``check`` (``vocab.behaviour``)."""

    def read(layers: Sequence[AttentionLayer]) -> FieldValue:
        return FieldValue.observed(check(per_layer({layer.index: kind_of(layer) for layer in layers}), source), source)

    return read


#: Each behaviour field's reader.
READERS: dict[str, Reader] = {
    "rope": read_rope,
    "mask": _each_layer(
        _mask_kind,
        mask,
        "attention layers' attn_type (decoder: causal) and impl.sliding_window as the kernel receives it "
        "((W-1, 0) or CPU_ATTN's W: W-1 keys before the query)",
    ),
    "softmax": _each_layer(
        _softmax_kind,
        softmax,
        "attention layers' impl.scale, impl.logits_soft_cap (0: none) and sinks (impl.sinks or the attention "
        "module's sinks parameter: learnable)",
    ),
}


def read_behaviour(
    static_forward_context: Mapping[str, Any], modules: Mapping[str, Any] | None
) -> tuple[dict[str, FieldValue], list[str]]:
    """``rope``, ``mask`` and ``softmax`` of one warmed-up engine's attention layers (each observed or
    unobservable with the reason), and the problems to note: a reader's failures other than a layer
    that does not show what it needs."""
    layers = attention_layers(static_forward_context, modules or {})
    if not layers:
        why = "no softmax attention layer in static_forward_context"
        return {name: FieldValue.unobservable(None, why) for name in BEHAVIOUR_FIELDS}, []
    fields, problems = {}, []
    for name in BEHAVIOUR_FIELDS:
        try:
            fields[name] = READERS[name](layers)
        except (Unreadable, NotARotation, ContractError) as err:
            fields[name] = FieldValue.unobservable(None, f"not read from the engine's modules: {err}")
        except Exception as err:  # a reader's own failure: visible, never the engine's
            problem = f"reading the attention {name} from the engine's modules failed: {type(err).__name__}: {err}"
            problems.append(problem)
            fields[name] = FieldValue.unobservable(None, problem)
    return fields, problems
