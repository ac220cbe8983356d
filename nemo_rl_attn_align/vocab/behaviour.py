"""Behaviour fingerprints: what a worker's live attention modules compute, as contract values.

The identity tier's configuration fields (``rope_type``, ``layer_windows``, ``softmax_scale``, ...)
say what each side *read*; two engines can read the same ``config.json`` and still compute different
functions (a window one token wider, the windowed layers swapped, a YaRN correction band rounded on
one side only). The three behaviour fields say what each side's modules *do*, measured on the live
modules by the hooks (``hosts.megatron_behaviour``, over ``hosts.behaviour_probe``):

* ``rope``: each attention layer's rotary embedding, evaluated at ``ROPE_POSITIONS``: which channel
  pairs it rotates together, by which angle at each position, and by what magnitude (YaRN's mscale);
* ``mask``: the mask each attention layer's kernel is given: causal or not, and how many keys before
  the query it sees (``window``; the query sees ``window + 1`` tokens, itself included; null: all);
* ``softmax``: the softmax as each layer's module holds it: the scale, the logit soft cap, the sinks.

Each value is ``{"kinds": [kind, ...], "layers": [[layer index, kind index], ...]}``: the distinct
per-layer behaviours once, then each attention layer's; ``rope`` adds ``positions``. A rope kind is
``{"head_dim", "pairs": [[a, b], ...], "angles": [[radians per pair] per position], "scales": [per
pair]}``: channel ``a`` and ``b`` rotate together (``a`` is the cosine side), angles wrapped to
(-pi, pi] as fp32 computes them (to 7 significant digits); a layer without rotary embedding has no
pairs. The checks below give each value its canonical form (``vocab.kinds`` style: ``(value, where)
-> value`` or ``ContractError``); ``binding.behaviour_difference`` finds the first difference. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from nemo_rl_attn_align.vocab.kinds import ContractError, boolean, choice, fp32, json_data, non_negative_int

#: Positions each rotary embedding is evaluated at: 1 gives every pair's rate (radians per position);
#: the others, near powers of two and prime, expose position scaling, YaRN's correction band and long
#: contexts without aliasing on a period. A side evaluates those below its largest position.
ROPE_POSITIONS = (1, 61, 4093, 131071)
#: ``softmax.sinks``: none, a learnable logit per head (gpt-oss), or a fixed zero logit.
SINKS = ("none", "learnable", "off-by-one")
#: The behaviour fields, in report order.
BEHAVIOUR_FIELDS = ("rope", "mask", "softmax")


def _items(value: Any, where: str, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise ContractError(f"{where}: expected a list of {what}, got {value!r}")
    return list(value)


def _object(value: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise ContractError(f"{where}: expected an object with {', '.join(keys)}, got {value!r}")
    return value


def _per_layer(check_kind: Callable[[Any, str], Any], extra: tuple[str, ...] = ()) -> Callable[[Any, str], dict]:
    """A kind for ``{"kinds": [...], "layers": [[layer, kind], ...], *extra}`` with each kind checked."""

    def check(value: Any, where: str) -> dict:
        data = _object(value, where, ("kinds", "layers", *extra))
        kinds = [
            check_kind(kind, f"{where}.kinds[{i}]") for i, kind in enumerate(_items(data["kinds"], where, "kinds"))
        ]
        layers: list[list[int]] = []
        for i, entry in enumerate(_items(data["layers"], where, "[layer, kind] pairs")):
            at = f"{where}.layers[{i}]"
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise ContractError(f"{at}: expected [layer index, kind index], got {entry!r}")
            layer, kind = non_negative_int(entry[0], at), non_negative_int(entry[1], at)
            if kind >= len(kinds):
                raise ContractError(f"{at}: kind {kind} does not exist ({len(kinds)} kinds)")
            if layers and layer <= layers[-1][0]:
                raise ContractError(f"{at}: layer indices must ascend without repeats")
            layers.append([layer, kind])
        return {"kinds": kinds, "layers": layers, **{key: data[key] for key in extra}}

    return check


#: Significant digits a measured number keeps: fp32 holds about 7.2, and the comparison's tolerances
#: (``binding.behaviour_difference``) are far wider than the last one; a record stays a few kB per layer kind.
DIGITS = 7


def _measured(value: Any, where: str) -> float:
    """A measured number (an angle, a magnitude) as fp32 computes it, kept to ``DIGITS`` digits."""
    return float(f"{fp32(value, where):.{DIGITS}g}")


def _angle(value: Any, where: str) -> float:
    angle = _measured(value, where)
    if not -math.pi - 1e-6 <= angle <= math.pi + 1e-6:
        raise ContractError(f"{where}: angle {value!r} is not wrapped to (-pi, pi]")
    return angle


def _rope_kind(value: Any, where: str) -> dict:
    data = _object(value, where, ("head_dim", "pairs", "angles", "scales"))
    head_dim = non_negative_int(data["head_dim"], f"{where}.head_dim")
    pairs = []
    for i, pair in enumerate(_items(data["pairs"], where, "channel pairs")):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ContractError(f"{where}.pairs[{i}]: expected [channel, channel], got {pair!r}")
        a, b = (non_negative_int(c, f"{where}.pairs[{i}]") for c in pair)
        if a == b or max(a, b) >= head_dim:
            raise ContractError(f"{where}.pairs[{i}]: {pair!r} is not two channels below head_dim {head_dim}")
        pairs.append([a, b])
    angles = [
        [_angle(x, f"{where}.angles[{p}]") for x in _items(row, where, "angles")]
        for p, row in enumerate(_items(data["angles"], where, "rows of angles"))
    ]
    scales = [_measured(x, f"{where}.scales") for x in _items(data["scales"], where, "scales")]
    if any(len(row) != len(pairs) for row in angles) or len(scales) != len(pairs):
        raise ContractError(f"{where}: every row of angles and the scales need one value per pair ({len(pairs)})")
    return {"head_dim": head_dim, "pairs": pairs, "angles": angles, "scales": scales}


def _positions(value: Any, where: str) -> list[int]:
    positions = [non_negative_int(p, f"{where}.positions") for p in _items(value, where, "positions")]
    if positions != sorted(set(positions)) or not set(positions) <= set(ROPE_POSITIONS):
        raise ContractError(f"{where}.positions: expected ascending positions of {ROPE_POSITIONS}, got {positions!r}")
    return positions


_rope_layers = _per_layer(_rope_kind, ("positions",))


def rope(value: Any, where: str) -> dict:
    """A ``rope`` value: per-layer rotary behaviour at ``positions`` (every kind one row per position)."""
    data = _rope_layers(value, where)
    data["positions"] = _positions(data["positions"], where)
    if any(len(kind["angles"]) != len(data["positions"]) for kind in data["kinds"]):
        raise ContractError(f"{where}: every kind needs one row of angles per position")
    return data


def _mask_kind(value: Any, where: str) -> dict:
    data = _object(value, where, ("causal", "window"))
    window = data["window"]
    return {
        "causal": boolean(data["causal"], f"{where}.causal"),
        "window": None if window is None else non_negative_int(window, f"{where}.window"),
    }


def _softmax_kind(value: Any, where: str) -> dict:
    data = _object(value, where, ("scale", "softcap", "sinks"))
    softcap = data["softcap"]
    return {
        "scale": fp32(data["scale"], f"{where}.scale"),
        "softcap": None if softcap is None else fp32(softcap, f"{where}.softcap"),
        "sinks": choice(*SINKS)(data["sinks"], f"{where}.sinks"),
    }


mask = _per_layer(_mask_kind)
softmax = _per_layer(_softmax_kind)


def per_layer(kinds_by_layer: Mapping[int, Any]) -> dict[str, Any]:
    """``{"kinds", "layers"}`` from layer index -> kind (equal kinds stored once, in first-use order)."""
    kinds: list[Any] = []
    layers = []
    for layer in sorted(kinds_by_layer):
        kind = json_data(kinds_by_layer[layer], f"layer {layer}")
        if kind not in kinds:
            kinds.append(kind)
        layers.append([layer, kinds.index(kind)])
    return {"kinds": kinds, "layers": layers}


def layer_kinds(value: Mapping[str, Any]) -> dict[int, Any]:
    """Layer index -> its kind, from a checked behaviour value."""
    return {layer: value["kinds"][kind] for layer, kind in value["layers"]}
