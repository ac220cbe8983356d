"""The model's attention as one host builds it: frozen ``HostModel`` of ``LayerKind``s (stdlib only).

Both hosts' readings of a ``config.json`` land here, whether they come from the generated
architecture table (``architectures``), from the host run in a subprocess (``hosts.model_readers``)
or from a running engine's record:

* ``megatron_model(attributes)``: a Megatron-Bridge provider's attention attributes (the
  ``TransformerConfig``), laid out per layer by megatron-core's own rules, ported here and checked
  against megatron-core in the nemo_rl lane: ``hybrid_layer_pattern`` (one symbol per layer, ``*``
  attention; ``parse_hybrid_pattern``), ``linear_attention_freq`` (gated delta-net layers,
  ``get_linear_attention_pattern``), ``window_size`` / ``window_attn_skip_freq``
  (``is_layer_window_attention``), multi-latent attention (Transformer Engine sees q/k heads of
  ``qk_head_dim + qk_pos_emb_head_dim`` channels and v heads of ``v_head_dim``), the softmax scale
  (``softmax_scale``, else ``1/sqrt(kv_channels)``; megatron-core's attention has no soft cap).
  A provider whose layer spec builds its own core-attention module (Gemma 2's, Gemma 3's) decides
  each layer's window, scale and soft cap there: ``own_layers`` gives them per layer
  (``MEGATRON_OWN_LAYER_FACTS``, read from the modules the provider builds: ``hosts.model_readers``,
  or the architecture table's rules over the config.json, checked against the built modules in the
  nemo_rl lane).
* ``vllm_model(layers)``: vLLM's attention module of each layer (``VLLM_LAYER_ATTRIBUTES``, its
  impl's ``VLLM_IMPL_ATTRIBUTES`` and the ``selector.*`` inputs it handed the backend selector).

Layers with the same attention are one ``LayerKind`` (gpt-oss: the windowed and the full layers;
a hybrid: its attention layers only, with their indices). ``left_window`` and ``hf_left_window``
give a left sliding window as the kernel receives it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.vocab.kinds import ContractError, fp32
from nemo_rl_attn_align.vocab.limits import MAX_MODEL_LAYERS, integer_problem, shown

#: megatron-core's hybrid layer symbols (``models/hybrid/hybrid_layer_allocation.Symbols``): attention.
HYBRID_ATTENTION = "*"
#: ``TransformerConfig.experimental_attention_variant`` values and what their layers are.
LINEAR_VARIANTS = ("gated_delta_net",)
SPARSE_VARIANTS = ("dsa",)


def left_window(window: Any) -> int | None:
    """The left window of a ``(left, right)`` pair as flash-attn and TE take it (Megatron's
    ``window_size``, vLLM's ``impl.sliding_window``); None for no pair or a negative left (-1: no window)."""
    if not isinstance(window, (list, tuple)) or len(window) != 2:
        return None
    left = window[0]
    if isinstance(left, bool) or not isinstance(left, int) or left < 0:
        return None
    return left


def hf_left_window(sliding_window: Any, use_sliding_window: Any = None) -> int | None:
    """The kernel's left window for an HF config's ``sliding_window`` (which counts the query itself:
    vLLM passes ``(sliding_window - 1, 0)`` to FlashAttention); None when there is no window."""
    if use_sliding_window is False or isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
        return None
    return sliding_window - 1 if sliding_window > 0 else None


@dataclass(frozen=True)
class MlaDims:
    """Multi-latent attention's ranks and head dims (Megatron's names; vLLM's ``qk_nope_head_dim`` is
    ``qk_head_dim``, its ``qk_rope_head_dim`` Megatron's ``qk_pos_emb_head_dim``)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class LayerKind:
    """One kind of attention layer as one host builds it.

    ``head_dim_qk`` / ``head_dim_v`` are what the attention kernel sees (TE under MLA: the q/k heads
    with their rotary part; vLLM under MLA: the latent plus rotary head it decodes with); ``softmax``
    is Megatron's ``softmax_type`` (vLLM: ``learnable`` where the layer has sinks); ``variant`` says
    which attention it is (``self``, ``mla``, ``dsa`` for Megatron, or the provider's own module
    that computes it; vLLM's module name);
    ``softmax_scale`` the scale the kernel multiplies QK^T by and ``softcap`` the attention logit
    soft cap (0.0: none), each as fp32 (as kernels take them) and None where the host's reading does
    not give it."""

    layers: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    window: int | None = None
    softmax: str = "vanilla"
    mla: MlaDims | None = None
    sparse: bool = False
    variant: str = "self"
    output_gate: bool | None = None
    softmax_scale: float | None = None
    softcap: float | None = None

    @property
    def sinks(self) -> bool:
        """Whether the softmax adds a learnable (or fixed, off-by-one) sink logit per head."""
        return self.softmax != "vanilla"

    def describe(self, num_layers: int) -> str:
        """One phrase: which layers, heads, head dims, window, softmax."""
        dims = str(self.head_dim_qk) if self.head_dim_qk == self.head_dim_v else f"{self.head_dim_qk}/{self.head_dim_v}"
        parts = [f"{self.heads} heads / {self.kv_heads} KV", f"head dim {dims}"]
        parts.append("no window" if self.window is None else f"window {self.window}")
        if self.softmax != "vanilla":
            parts.append(f"{self.softmax} softmax (sinks)")
        if self.mla is not None:
            parts.append(f"MLA (kv_lora_rank {self.mla.kv_lora_rank}, rope {self.mla.qk_pos_emb_head_dim})")
        if self.sparse:
            parts.append("sparse (indexer)")
        if self.softcap:
            parts.append(f"logit soft cap {self.softcap:g}")
        which = "all layers" if len(self.layers) == num_layers else f"layers {layer_ranges(self.layers)}"
        return f"{which} ({len(self.layers)} of {num_layers}): {', '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["layers"] = list(self.layers)
        out["mla"] = self.mla.to_dict() if self.mla else None
        return out


def layer_ranges(indices: Sequence[int]) -> str:
    """``0,2,4`` as written, runs as ``0-3``."""
    parts, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts)


@dataclass(frozen=True)
class HostModel:
    """One host's build of the model: its layers' attention, grouped into kinds, and where that was read."""

    host: str
    source: str
    num_layers: int
    kinds: tuple[LayerKind, ...]
    notes: tuple[str, ...] = ()

    def attention_layers(self) -> list[int]:
        """The indices of the attention layers, in order."""
        return sorted(index for kind in self.kinds for index in kind.layers)

    def per_layer(self) -> list[LayerKind]:
        """The kind of each attention layer, in layer order."""
        by_index = {index: kind for kind in self.kinds for index in kind.layers}
        return [by_index[index] for index in sorted(by_index)]

    def layout(self) -> list[str]:
        """One line per layer kind: its layers and attention, with the softmax scale where it was read."""
        return [
            kind.describe(self.num_layers) + ("" if kind.softmax_scale is None else f", scale {kind.softmax_scale:.6g}")
            for kind in self.kinds
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "source": self.source,
            "num_layers": self.num_layers,
            "kinds": [kind.to_dict() for kind in self.kinds],
            "layout": self.layout(),
            "notes": list(self.notes),
        }


def group_layers(entries: Sequence[tuple[int, Mapping[str, Any]]]) -> tuple[LayerKind, ...]:
    """``(layer index, LayerKind fields)`` pairs as kinds: layers with equal fields share one kind."""
    grouped: dict[tuple, list[int]] = {}
    fields: dict[tuple, Mapping[str, Any]] = {}
    for index, values in entries:
        key = tuple(sorted((k, repr(v)) for k, v in values.items()))
        grouped.setdefault(key, []).append(index)
        fields.setdefault(key, values)
    kinds = [LayerKind(layers=tuple(indices), **fields[key]) for key, indices in grouped.items()]
    return tuple(sorted(kinds, key=lambda kind: kind.layers[0]))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fp32(value: Any) -> float | None:
    """A number as the fp32 a kernel takes it (hosts compute ``d ** -0.5`` and ``1/sqrt(d)`` a bit apart)."""
    try:
        return fp32(value, "a softmax value")
    except ContractError:
        return None


def megatron_symbols(attributes: Mapping[str, Any]) -> list[str] | str:
    """Each layer's attention as megatron-core builds it (``self``, ``mla``, ``dsa``, or another
    symbol for a layer without softmax attention); a string says why it is not known."""
    count: Any = attributes.get("num_layers")
    pattern = attributes.get("hybrid_layer_pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) > MAX_MODEL_LAYERS:
            return f"hybrid_layer_pattern has {len(pattern)} symbols, over the limit of {MAX_MODEL_LAYERS} layers"
        main = pattern.split("/")[0].replace("|", "")  # parse_hybrid_pattern: "/" starts the MTP part
        return ["self" if symbol == HYBRID_ATTENTION else symbol for symbol in main]
    if (why := integer_problem(count, MAX_MODEL_LAYERS)) is not None:
        return f"num_layers={shown(count)} {why}"
    variant = attributes.get("experimental_attention_variant")
    attention = "mla" if attributes.get("multi_latent_attention") else "self"
    if variant is None:
        return [attention] * count
    if variant in SPARSE_VARIANTS:
        return [variant] * count
    if variant not in LINEAR_VARIANTS:
        return f"experimental_attention_variant={variant!r} is not a variant this plugin lays out"
    freq = attributes.get("linear_attention_freq")
    every = _int(freq)
    if every:  # get_linear_attention_pattern: one softmax-attention layer every N
        return [attention if (i + 1) % every == 0 else variant for i in range(count)]
    if isinstance(freq, list) and len(freq) == count:
        return [variant if flag else attention for flag in freq]
    return f"linear_attention_freq={freq!r} does not lay out {count} layers"


def megatron_window(attributes: Mapping[str, Any], layer_number: int) -> int | None:
    """The left window of (1-based) ``layer_number``, by megatron-core's ``is_layer_window_attention``."""
    window, skip = attributes.get("window_size"), attributes.get("window_attn_skip_freq")
    if not window:
        return None
    if isinstance(skip, int) and not isinstance(skip, bool) and skip > 0 and layer_number % skip == 0:
        return None
    if isinstance(skip, list) and not (len(skip) >= layer_number and skip[layer_number - 1]):
        return None
    return left_window(window)


#: What a provider's own core-attention module decides per layer (``megatron_model``'s ``own_layers``):
#: the left window its kernel is given (None: full), the softmax scale, the
#: attention logit soft cap (None or 0.0: none), and ``module``: its class where it computes attention
#: itself (Gemma 2's; the kind's ``variant``), None where it hands Transformer Engine's kernels the work.
MEGATRON_OWN_LAYER_FACTS = ("window", "softmax_scale", "softcap", "module")


def megatron_softmax(attributes: Mapping[str, Any], symbol: str) -> tuple[float | None, float]:
    """The softmax scale and soft cap of a megatron-core attention layer (TE's and the local
    ``DotProductAttention``): ``softmax_scale``, else ``1/sqrt(kv_channels)``; no soft cap. Under
    multi-latent attention the scale is its own (YaRN's mscale): None."""
    if symbol != "self":
        return None, 0.0
    scale, channels = attributes.get("softmax_scale"), _int(attributes.get("kv_channels"))
    return _fp32(scale or (1.0 / math.sqrt(channels) if channels else None)), 0.0


def own_layer_values(facts: Mapping[str, Any]) -> dict[str, Any]:
    """``LayerKind`` fields from a provider's own module's ``MEGATRON_OWN_LAYER_FACTS`` of one layer."""
    values = {
        "window": _int(facts.get("window")),
        "softmax_scale": _fp32(facts.get("softmax_scale")),
        "softcap": _fp32(facts.get("softcap")) or 0.0,
    }
    if isinstance(facts.get("module"), str) and facts["module"]:
        values["variant"] = facts["module"]
    return values


def megatron_model(
    attributes: Mapping[str, Any],
    host: str,
    source: str,
    own_layers: Sequence[Mapping[str, Any]] | None = None,
) -> HostModel | str:
    """The layers Megatron builds from a provider's attention attributes (``own_layers``: each
    layer's facts from the provider's own attention module); a string says why not known."""
    symbols = megatron_symbols(attributes)
    if isinstance(symbols, str):
        return symbols
    if own_layers is not None and len(own_layers) != len(symbols):
        return f"the provider's own attention modules give {len(own_layers)} layers for {len(symbols)}"
    heads, kv = _int(attributes.get("num_attention_heads")), _int(attributes.get("num_query_groups"))
    channels = _int(attributes.get("kv_channels"))
    if heads is None:
        return "num_attention_heads is not an integer"
    entries = []
    for index, symbol in enumerate(symbols):
        if symbol not in ("self", "mla", "dsa"):
            continue
        scale, cap = megatron_softmax(attributes, symbol)
        values: dict[str, Any] = {
            "window": megatron_window(attributes, index + 1),
            "softmax": str(attributes.get("softmax_type") or "vanilla"),
            "variant": symbol,
            "sparse": symbol == "dsa",
            "output_gate": bool(attributes.get("attention_output_gate")),
            "softmax_scale": scale,
            "softcap": cap,
        }
        if own_layers is not None:
            values.update(own_layer_values(own_layers[index]))
        if symbol == "self":
            if channels is None:
                return "kv_channels is not an integer"
            values.update(heads=heads, kv_heads=kv or heads, head_dim_qk=channels, head_dim_v=channels)
        else:
            mla = _mla(attributes, "qk_head_dim", "qk_pos_emb_head_dim")
            if isinstance(mla, str):
                return mla
            qk = mla.qk_head_dim + mla.qk_pos_emb_head_dim
            values.update(heads=heads, kv_heads=heads, head_dim_qk=qk, head_dim_v=mla.v_head_dim, mla=mla)
        entries.append((index, values))
    return HostModel(host, source, len(symbols), group_layers(entries))


def _mla(values: Mapping[str, Any], nope: str, rope: str) -> MlaDims | str:
    names = ("kv_lora_rank", nope, rope, "v_head_dim")
    dims = [_int(values.get(name)) for name in names]
    missing = [name for name, value in zip(names, dims, strict=True) if value is None]
    if missing:
        return f"multi-latent attention without {', '.join(missing)}"
    kv_lora, qk, qk_rope, v = (d for d in dims if d is not None)
    return MlaDims(_int(values.get("q_lora_rank")), kv_lora, qk, qk_rope, v)


#: The provider (``TransformerConfig``) attributes that decide what attention Megatron builds.
MEGATRON_ATTRIBUTES = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "softmax_type",
    "softmax_scale",
    "window_size",
    "window_attn_skip_freq",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "experimental_attention_variant",
    "linear_attention_freq",
    "hybrid_layer_pattern",
    "is_hybrid_model",
    "attention_output_gate",
    "rotary_percent",
    "position_embedding_type",
)
#: The attributes of a vLLM attention layer module that decide its attention (``Attention``,
#: ``MLAAttention``); ``hosts.model_readers`` and the rollout record read the same ones.
VLLM_LAYER_ATTRIBUTES = (
    "num_heads",
    "num_kv_heads",
    "head_size",
    "head_size_v",
    "sliding_window",
    "has_sink",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
#: The attributes of a vLLM attention layer's impl (the backend's) that decide its softmax, read as
#: ``impl.<name>``: the scale and the logit soft cap (0 or None: none); not under multi-latent
#: attention, whose scale carries YaRN's mscale, which the sampled configs do not vary.
VLLM_IMPL_ATTRIBUTES = ("scale", "logits_soft_cap")


def vllm_layer_kind(facts: Mapping[str, Any]) -> dict[str, Any] | str:
    """The ``LayerKind`` fields of one vLLM attention layer's facts; a string says why not known."""
    heads, head_size = _int(facts.get("num_heads")), _int(facts.get("head_size"))
    if heads is None or head_size is None:
        return f"the layer's {facts.get('module')} has no integer num_heads / head_size"
    sliding = facts.get("sliding_window")
    values: dict[str, Any] = {
        "heads": heads,
        "kv_heads": _int(facts.get("num_kv_heads")) or heads,
        "head_dim_qk": head_size,
        "head_dim_v": _int(facts.get("head_size_v")) or head_size,
        "window": left_window(sliding) if isinstance(sliding, (list, tuple)) else hf_left_window(sliding),
        "softmax": "learnable" if facts.get("has_sink") or facts.get("selector.has_sink") else "vanilla",
        "sparse": bool(facts.get("selector.use_sparse")),
        "variant": str(facts.get("module") or "Attention"),
        "output_gate": facts.get("output_gate"),
    }
    scale, cap = _fp32(facts.get("impl.scale")), _fp32(facts.get("impl.logits_soft_cap"))
    if scale is not None:
        values["softmax_scale"] = scale
    if "impl.logits_soft_cap" in facts:
        values["softcap"] = cap or 0.0
    if facts.get("selector.use_mla") or facts.get("kv_lora_rank") is not None:
        mla = _mla(facts, "qk_nope_head_dim", "qk_rope_head_dim")
        if isinstance(mla, str):
            return mla
        values.update(mla=mla, head_dim_v=mla.kv_lora_rank)
    return values


def vllm_model(layers: Sequence[Mapping[str, Any] | None], host: str, source: str) -> HostModel | str:
    """The attention layers of vLLM's model from each layer's facts (None or ``attention`` false:
    no softmax attention there); a string says why not known."""
    entries = []
    for index, facts in enumerate(layers):
        if not facts or not facts.get("attention"):
            continue
        values = vllm_layer_kind(facts)
        if isinstance(values, str):
            return f"layer {index}: {values}"
        entries.append((index, values))
    return HostModel(host, source, len(layers), group_layers(entries))


#: vLLM's softmax attention layer modules (a subclass counts: ``RSWAAttention``, ...); its other
#: ``AttentionLayerBase`` layers (Mamba, gated delta-net, an indexer's cache) run none.
ATTENTION_MODULES = ("Attention", "MLAAttention")


def is_attention_module(module: Any) -> bool:
    """Whether ``module`` is one of vLLM's softmax attention layers (by its classes' names: no import)."""
    return any(cls.__name__ in ATTENTION_MODULES for cls in type(module).__mro__)


def layer_index(name: str) -> int | None:
    """The layer index in a vLLM layer name (``model.layers.3.self_attn.attn`` -> 3; None unless one)."""
    numbers = [int(part) for part in name.split(".") if part.isdigit()]
    return numbers[0] if len(numbers) == 1 else None


def vllm_layer_facts(
    named_layers: Sequence[tuple[str, Any]],
    selectors: Mapping[str, Mapping[str, Any]] | None = None,
    modules: Mapping[str, Any] | None = None,
) -> dict[int, dict[str, Any]]:
    """Layer index -> the facts of vLLM's attention-layer modules (``VLLM_LAYER_ATTRIBUTES``, and the
    ``selector.*`` inputs recorded for it): one per layer, its softmax attention module where it has
    one. With the model's ``modules`` (by name), ``output_gate`` is the ``attn_output_gate`` of the
    module that holds the layer (vLLM's gated attention, Qwen3-Next / Qwen3.5; false where that
    module has none: its model code gates nothing). ``hosts.model_readers`` reads a model built on
    the meta device, the rollout record a running engine's ``static_forward_context``."""
    layers: dict[int, dict[str, Any]] = {}
    for name, module in named_layers:
        index = layer_index(name)
        attention = is_attention_module(module)
        if index is None or (index in layers and (layers[index]["attention"] or not attention)):
            continue
        facts: dict[str, Any] = {"module": type(module).__name__, "attention": attention}
        for attribute in VLLM_LAYER_ATTRIBUTES:
            if hasattr(module, attribute):
                value = getattr(module, attribute)
                facts[attribute] = list(value) if isinstance(value, tuple) else value
        impl = getattr(module, "impl", None)
        for attribute in VLLM_IMPL_ATTRIBUTES if attention and "kv_lora_rank" not in facts else ():  # MLA's: its own
            if hasattr(impl, attribute):
                facts[f"impl.{attribute}"] = getattr(impl, attribute)
        if getattr(module, "indexer", None) is not None:
            facts["selector.use_sparse"] = True
        for field, value in (selectors or {}).get(name, {}).items():
            facts[f"selector.{field}"] = value
        holder = (modules or {}).get(name.rpartition(".")[0]) if modules is not None else None
        if modules is not None and attention:
            facts["output_gate"] = bool(getattr(holder, "attn_output_gate", False))
        layers[index] = facts
    return layers
