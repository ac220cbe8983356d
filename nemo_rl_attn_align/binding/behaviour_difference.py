"""Where two sides' behaviour fingerprints (``vocab.behaviour``) first differ, in the user's terms.

``difference(field, training, rollout)`` compares one behaviour field layer by layer and returns
``None`` when the two compute the same function, else a ``BehaviourDifference`` naming the first
attention layer that differs, the first position where it shows (a token position for RoPE, a query
position for the mask) and a fix that says what differs. Angles are compared within fp32 evaluation
noise (``ANGLE_ABS`` plus ``ANGLE_REL`` of the angle before wrapping: two rotary modules built from one
config may round an inverse frequency one ulp apart), magnitudes and softmax numbers within
``RELATIVE``; everything else exactly. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.vocab.behaviour import layer_kinds

#: Angles agree within this many radians plus ``ANGLE_REL`` of the unwrapped angle (position x rate).
ANGLE_ABS = 1e-5
ANGLE_REL = 4e-7
#: Magnitudes, scales and soft caps agree within this relative difference.
RELATIVE = 1e-5


@dataclass(frozen=True)
class BehaviourDifference:
    """The first place two behaviour fingerprints differ: the attention layer (None: the sides measured
    different layers), the position it shows at, one line saying what differs, and the fix."""

    field: str
    layer: int | None
    position: int | None
    message: str
    fix: str


def _wrapped(angle: float) -> float:
    """``angle`` wrapped to (-pi, pi]."""
    return math.pi - (math.pi - angle) % (2 * math.pi)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b))


def _ranges(layers: Sequence[int]) -> str:
    """``0,2,4`` as written, runs as ``0-3``."""
    parts: list[str] = []
    for layer in layers:
        if parts and parts[-1].split("-")[-1] == str(layer - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{layer}"
        else:
            parts.append(str(layer))
    return ",".join(parts) or "none"


def _pairing(pairs: Sequence[Sequence[int]], head_dim: int) -> str:
    """The channel pairing by name where it has one."""
    n = len(pairs)
    if [list(p) for p in pairs] == [[i, i + n] for i in range(n)]:
        rotated = f"{2 * n} of {head_dim} channels" if 2 * n != head_dim else "all channels"
        return f"half-split pairs (NeoX style, rotary_interleaved false), {rotated}"
    if [list(p) for p in pairs] == [[2 * i, 2 * i + 1] for i in range(n)]:
        rotated = f"{2 * n} of {head_dim} channels" if 2 * n != head_dim else "all channels"
        return f"adjacent pairs (GPT-J style, rotary_interleaved true), {rotated}"
    return f"{n} pairs starting {[list(p) for p in pairs[:3]]}"


# --- rope ----------------------------------------------------------------------------------------


def _rope_kind(
    layer: int, t: Mapping[str, Any], r: Mapping[str, Any], positions: Sequence[int]
) -> tuple[str, int | None] | None:
    """What differs between two rope kinds of ``layer`` (message, position), or None."""
    if t["head_dim"] != r["head_dim"] or t["pairs"] != r["pairs"]:
        return (
            f"layer {layer} rotates {_pairing(t['pairs'], t['head_dim'])} in training, "
            f"{_pairing(r['pairs'], r['head_dim'])} in rollout",
            None,
        )
    rows_t = dict(zip(positions, t["angles"], strict=True))
    rows_r = dict(zip(positions, r["angles"], strict=True))
    rates = [
        max(abs(a), abs(b))
        for a, b in zip(rows_t.get(1, [0.0] * len(t["pairs"])), rows_r.get(1, [0.0] * len(t["pairs"])), strict=True)
    ]
    for position in positions:
        for i, (a, b) in enumerate(zip(rows_t[position], rows_r[position], strict=True)):
            if abs(_wrapped(a - b)) > ANGLE_ABS + ANGLE_REL * position * rates[i]:
                channels = "/".join(map(str, t["pairs"][i]))
                return (
                    f"layer {layer}, position {position}, channels {channels}: training rotates by {a:.6g} rad, "
                    f"rollout by {b:.6g} rad (at position 1: {rows_t.get(1, [math.nan] * (i + 1))[i]:.6g} and "
                    f"{rows_r.get(1, [math.nan] * (i + 1))[i]:.6g} rad)",
                    position,
                )
    for i, (a, b) in enumerate(zip(t["scales"], r["scales"], strict=True)):
        if not _close(a, b):
            channels = "/".join(map(str, t["pairs"][i]))
            return (
                f"layer {layer}, channels {channels}: training scales the rotation by {a:.6g}, rollout by {b:.6g}",
                1,
            )
    return None


def _rope(t: Mapping[str, Any], r: Mapping[str, Any]) -> BehaviourDifference | None:
    positions = sorted(set(t["positions"]) & set(r["positions"]))
    t_layers, r_layers = layer_kinds(t), layer_kinds(r)
    index = {p: i for i, p in enumerate(t["positions"])}, {p: i for i, p in enumerate(r["positions"])}
    for layer in sorted(set(t_layers) & set(r_layers)):
        kt, kr = t_layers[layer], r_layers[layer]
        kt = {**kt, "angles": [kt["angles"][index[0][p]] for p in positions]}
        kr = {**kr, "angles": [kr["angles"][index[1][p]] for p in positions]}
        found = _rope_kind(layer, kt, kr, positions)
        if found is not None:
            return BehaviourDifference(
                "rope",
                layer,
                found[1],
                f"rope: {found[0]}",
                "the two engines rotate queries and keys differently; the rope_type and rope_parameters each side "
                "read are below: where they agree, the engines compute the same config.json differently (a YaRN "
                "correction band rounded on one side only, scaling fields that did not reach the model): update "
                "the engine that differs from Hugging Face's, or align its RoPE settings (model_overrides / "
                "hf_overrides); `nemo-rl-attn-align probe CONFIG` measures what it costs in logprobs",
            )
    return _layers_differ("rope", t_layers, r_layers)


# --- mask ----------------------------------------------------------------------------------------


def _visible(window: int | None) -> str:
    return "every earlier token" if window is None else f"{window + 1} tokens"


def _mask(t: Mapping[str, Any], r: Mapping[str, Any]) -> BehaviourDifference | None:
    t_layers, r_layers = layer_kinds(t), layer_kinds(r)
    common = sorted(set(t_layers) & set(r_layers))
    differing = [layer for layer in common if t_layers[layer] != r_layers[layer]]
    if not differing:
        return _layers_differ("mask", t_layers, r_layers)
    layer = differing[0]
    kt, kr = t_layers[layer], r_layers[layer]
    if kt["causal"] != kr["causal"]:
        causal = "causal in training, not in rollout" if kt["causal"] else "causal in rollout, not in training"
        return BehaviourDifference(
            "mask", layer, 0, f"mask: layer {layer} is {causal}", "both sides must run causal attention"
        )
    wt, wr = kt["window"], kr["window"]
    narrow = min(w for w in (wt, wr) if w is not None)
    position = narrow + 1
    message = (
        f"mask: layer {layer}: from query position {position} on, the training kernel sees {_visible(wt)}, "
        f"the rollout kernel {_visible(wr)}"
    )
    windowed_t = [layer for layer in common if t_layers[layer]["window"] is not None]
    windowed_r = [layer for layer in common if r_layers[layer]["window"] is not None]
    if windowed_t != windowed_r:
        message += f"; training windows layers {_ranges(windowed_t)}, rollout layers {_ranges(windowed_r)}"
        fix = (
            "the two sides run sliding-window attention on different layers, so those layers attend to different "
            "tokens: each side lays the layers out from config.json (layer_types, sliding_window_pattern); "
            "Megatron's windowed layers follow window_size and window_attn_skip_freq (or the converter's own "
            "attention module): use a converter (Megatron-Bridge) that lays the layers out as Hugging Face does"
        )
    elif wt is not None and wr is not None and abs(wt - wr) == 1:
        fix = (
            f"the window is off by one: a query sees {wt + 1} tokens in training and {wr + 1} in rollout "
            "(Megatron's window_size counts the keys before the query; Hugging Face's sliding_window counts the "
            "query too): add the override ++policy.megatron_cfg.model_overrides.window_size="
            f"[{wr},0] to see what vLLM sees, or use a converter (Megatron-Bridge) that gives window_size "
            "(sliding_window - 1, 0)"
        )
    else:
        fix = (
            f"the windows differ ({_visible(wt)} in training, {_visible(wr)} in rollout): both sides must read one "
            "sliding_window (policy.megatron_cfg.model_overrides.window_size is Megatron's, in keys before the "
            "query; vLLM's hf_overrides.sliding_window counts the query too)"
        )
    return BehaviourDifference("mask", layer, position, message, fix)


# --- softmax -------------------------------------------------------------------------------------


def _softmax(t: Mapping[str, Any], r: Mapping[str, Any]) -> BehaviourDifference | None:
    t_layers, r_layers = layer_kinds(t), layer_kinds(r)
    for layer in sorted(set(t_layers) & set(r_layers)):
        kt, kr = t_layers[layer], r_layers[layer]
        for key, what, fix in (
            ("scale", "scales QK^T by", "both sides must scale the logits alike: Megatron's "
             "policy.megatron_cfg.model_overrides.softmax_scale, vLLM's scale follows config.json "
             "(head_dim, query_pre_attn_scalar)"),
            ("softcap", "soft-caps the logits at", "both sides must cap the logits alike (config.json "
             "attn_logit_softcapping): a side without it computes another function"),
            ("sinks", "adds sinks:", "both sides must add the same sink logits (softmax_type)"),
        ):  # fmt: skip
            a, b = kt[key], kr[key]
            same = a == b if key == "sinks" else _close(a, b)
            if not same:
                return BehaviourDifference(
                    "softmax",
                    layer,
                    None,
                    f"softmax: layer {layer}: training {what} {_shown(a)}, rollout {what} {_shown(b)}",
                    fix,
                )
    return _layers_differ("softmax", t_layers, r_layers)


def _shown(value: Any) -> str:
    return "none" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _layers_differ(field: str, t_layers: Mapping[int, Any], r_layers: Mapping[int, Any]) -> BehaviourDifference | None:
    """The sides measured different attention layers (None: the same)."""
    if set(t_layers) == set(r_layers):
        return None
    only_t, only_r = sorted(set(t_layers) - set(r_layers)), sorted(set(r_layers) - set(t_layers))
    return BehaviourDifference(
        field,
        None,
        None,
        f"{field}: attention layers measured only in training: {_ranges(only_t)}; only in rollout: {_ranges(only_r)}",
        "both sides must run softmax attention on the same layers (see attention_layers)",
    )


_COMPARE = {"rope": _rope, "mask": _mask, "softmax": _softmax}


def difference(field: str, training: Mapping[str, Any], rollout: Mapping[str, Any]) -> BehaviourDifference | None:
    """Where the checked behaviour values of ``field`` first differ (None: the same function)."""
    return _COMPARE[field](training, rollout)
