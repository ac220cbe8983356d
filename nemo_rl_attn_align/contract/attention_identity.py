"""The identity fields one host's build of the model fixes: the one mapping for previews and records.

``model_identity(b, model, how)`` sets ``num_layers``, ``attention_layers``, ``num_attention_heads``,
``num_query_groups``, ``head_dim``, ``head_dim_v``, ``sliding_window``, ``layer_windows``,
``softmax_type`` and ``mla`` from a ``model.model_attention.HostModel``: the preview's (the hosts'
readings of the config.json) and each worker's (its running model) go through the same code, so a
field means the same on both sides; ``softmax_scale`` and ``logit_softcapping`` too where the host's
reading gives them for every layer (else they are left as the caller set them). Under multi-latent
attention the fields are the model's own (heads, q/k and v head dims), not what a kernel sees (TE:
q/k with their rotary part; vLLM's decode: one latent KV head), so Megatron's and vLLM's builds of
one checkpoint compare equal.
``sliding_window`` is the one window of the windowed layers (gpt-oss, Gemma: the others have none;
``layer_windows`` tells them apart). A field whose value differs between layer kinds is left to
the per-layer fields. No host library is imported here.
"""

from __future__ import annotations

from typing import Any

from nemo_rl_attn_align.contract.contract import ContractBuilder, put_field
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import HostModel, LayerKind

FIELDS = (
    "num_layers",
    "attention_layers",
    "num_attention_heads",
    "num_query_groups",
    "head_dim",
    "head_dim_v",
    "sliding_window",
    "layer_windows",
    "softmax_type",
    "mla",
    "attention_output_gate",
)


def kind_identity(kind: LayerKind) -> dict[str, Any]:
    """One layer kind in the model's own terms (under MLA: every head has its own K and V)."""
    mla = kind.mla
    return {
        "num_attention_heads": kind.heads,
        "num_query_groups": kind.heads if mla is not None else kind.kv_heads,
        "head_dim": mla.qk_head_dim + mla.qk_pos_emb_head_dim if mla is not None else kind.head_dim_qk,
        "head_dim_v": mla.v_head_dim if mla is not None else kind.head_dim_v,
        "softmax_type": kind.softmax,
        "mla": mla.to_dict() if mla is not None else None,
        "attention_output_gate": kind.output_gate,
    }


def _put(b: ContractBuilder, name: str, value: Any, source: str, how: str) -> None:
    """``put_field``, with None a value (full attention, no MLA) rather than a missing one."""
    if value is None:
        getattr(b, how)(name, None, source)
    else:
        put_field(b, name, value, source, how)


def model_identity(b: ContractBuilder, model: HostModel | NotRead, how: str) -> None:
    """Set ``FIELDS`` from ``model`` (``how``: ``configured`` in a preview, ``observed`` in a record)."""
    preview = how == "configured"
    if isinstance(model, NotRead):
        for name in FIELDS:
            b.unknown(name, model.why, preview)
        return
    src = model.source
    put_field(b, "num_layers", model.num_layers, src, how)
    put_field(b, "attention_layers", model.attention_layers(), src, how)
    layers = model.per_layer()
    if not layers:
        for name in FIELDS[2:]:
            b.unknown(name, f"{src}: the model has no softmax attention layer", preview)
        return
    identities = [kind_identity(kind) for kind in layers]
    for name in identities[0]:
        if name == "attention_output_gate" and identities[0][name] is None:
            b.unknown(name, f"{src}: the model's modules were not shown (the gate is their attribute)", preview)
        elif len({repr(identity[name]) for identity in identities}) == 1:
            _put(b, name, identities[0][name], src, how)
        else:
            b.unknown(name, f"{src}: differs between layer kinds", preview)
    windows = [kind.window for kind in layers]
    put_field(b, "layer_windows", windows, f"{src}: the left window of each attention layer", how)
    window_field(b, windows, src, how, preview)
    _softmax_fields(b, layers, src, how, preview)


def _softmax_fields(b: ContractBuilder, layers: list[LayerKind], source: str, how: str, preview: bool) -> None:
    """``softmax_scale`` and ``logit_softcapping`` (a soft cap of 0: none) where every layer's reading
    gives them; unknown where layer kinds differ."""
    for name, values, what in (
        ("softmax_scale", [kind.softmax_scale for kind in layers], "softmax scale"),
        ("logit_softcapping", [kind.softcap for kind in layers], "logit soft cap (0: none)"),
    ):
        known = [value for value in values if value is not None]
        if len(known) < len(values):
            continue
        distinct = sorted(set(known))
        if len(distinct) > 1:
            b.unknown(name, f"{source}: differs between layer kinds: {distinct}", preview)
        else:
            _put(b, name, distinct[0] or None, f"{source}: each attention layer's {what}", how)


def window_field(b: ContractBuilder, windows: list[int | None], source: str, how: str, preview: bool) -> None:
    """``sliding_window`` from each layer's left window (``layer_windows``): the one window of the
    windowed layers (None: none has one), unknown where they differ."""
    windowed = sorted({w for w in windows if w is not None})
    if len(windowed) > 1:
        b.unknown("sliding_window", f"{source}: windowed layers differ: {windowed} (see layer_windows)", preview)
        return
    full = sum(w is None for w in windows)
    note = f" ({full} of {len(windows)} layers have no window: see layer_windows)" if windowed and full else ""
    _put(b, "sliding_window", windowed[0] if windowed else None, source + note, how)
