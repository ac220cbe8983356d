"""Value kinds of contract fields: each checks one value and returns its canonical form.

A kind is a function ``(value, where) -> canonical value`` that raises ``ContractError`` naming
``where`` (the field) when the value does not fit; ``schema.FIELDS`` gives each field one. Also the
canonical dtype spellings (``DTYPES``, ``normalize_dtype``) that the engines' readers share.
Stdlib only.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from nemo_rl_attn_align.vocab.suggest import did_you_mean


class ContractError(ValueError):
    """A contract (or one of its fields) that does not fit the schema; the message names the field."""


# --- dtypes ------------------------------------------------------------------------------------

#: Each canonical dtype spelling (the one every dtype field uses) with the spellings that mean it.
_DTYPE_SPELLINGS = {
    "fp32": ("float32", "float", "torch.float32", "torch.float"),
    "bf16": ("bfloat16", "torch.bfloat16"),
    "fp16": ("float16", "half", "torch.float16", "torch.half"),
    "fp8": ("float8", "fp8_e4m3", "torch.float8_e4m3fn"),
}
_DTYPE_ALIASES = {alias: name for name, aliases in _DTYPE_SPELLINGS.items() for alias in (name, *aliases)}
#: Canonical dtype spellings used by every dtype field.
DTYPES = tuple(_DTYPE_SPELLINGS)


def normalize_dtype(value: Any) -> str:
    """Canonical short dtype name for a torch dtype, a torch spelling or a short spelling.

    ``torch.bfloat16``, ``"bfloat16"`` and ``"bf16"`` all give ``"bf16"``; anything else raises
    ``ContractError``.
    """
    key = str(value).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ContractError(f"unknown dtype {value!r}; use one of {', '.join(DTYPES)} (torch spellings are accepted)")
    return _DTYPE_ALIASES[key]


def dtype_or_none(value: Any) -> str | None:
    """``normalize_dtype(value)``, or None for None or a spelling it does not know."""
    try:
        return normalize_dtype(value) if value is not None else None
    except ContractError:
        return None


# --- kinds -------------------------------------------------------------------------------------


def json_data(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (tuples become lists); rejects NaN/inf and non-string keys."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContractError(f"{where}: {value!r} is not a finite number (JSON cannot carry it)")
        return value
    if isinstance(value, (list, tuple)):
        return [json_data(item, where) for item in value]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ContractError(f"{where}: mapping key {key!r} is not a string")
            out[key] = json_data(item, where)
        return out
    raise ContractError(f"{where}: {type(value).__name__} value {value!r} is not JSON data")


def integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}: expected an integer, got {value!r}")
    return value


def non_negative_int(value: Any, where: str) -> int:
    value = integer(value, where)
    if value < 0:
        raise ContractError(f"{where}: expected an integer >= 0, got {value!r}")
    return value


def positive_int(value: Any, where: str) -> int:
    value = integer(value, where)
    if value < 1:
        raise ContractError(f"{where}: expected a positive integer, got {value!r}")
    return value


def real_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"{where}: expected a number, got {value!r}")
    return json_data(float(value), where)


def fp32(value: Any, where: str) -> float:
    """A number as the fp32 a kernel receives it (C ``float``), kept as the exactly representable double."""
    number = real_number(value, where)
    try:
        rounded = struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        rounded = math.inf
    if math.isinf(rounded):
        raise ContractError(f"{where}: {value!r} does not fit a 32-bit float")
    return rounded


def positive_fp32(value: Any, where: str) -> float:
    number = fp32(value, where)
    if number <= 0:
        raise ContractError(f"{where}: expected a number > 0, got {value!r}")
    return number


def layer_windows(value: Any, where: str) -> list:
    """One left window (int >= 0) or null (full attention) per layer, in layer order."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ContractError(
            f"{where}: expected a non-empty list of per-layer windows (int >= 0 or null), got {value!r}"
        )
    return [None if item is None else non_negative_int(item, f"{where}[{i}]") for i, item in enumerate(value)]


def layer_indices(value: Any, where: str) -> list:
    """Layer indices (int >= 0), ascending; an empty list is a model without such layers."""
    if not isinstance(value, (list, tuple)):
        raise ContractError(f"{where}: expected a list of layer indices, got {value!r}")
    indices = [non_negative_int(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if indices != sorted(set(indices)):
        raise ContractError(f"{where}: layer indices must ascend without repeats, got {indices!r}")
    return indices


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{where}: expected true or false, got {value!r}")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ContractError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def dtype(value: Any, where: str) -> str:
    try:
        return normalize_dtype(value)
    except ContractError as err:
        raise ContractError(f"{where}: {err}") from None


def mapping(value: Any, where: str) -> dict:
    if not isinstance(value, Mapping):
        raise ContractError(f"{where}: expected a mapping, got {value!r}")
    return json_data(value, where)


def backend(value: Any, where: str) -> Any:
    """One backend name, or a mapping layer -> backend name when layers differ."""
    if isinstance(value, Mapping):
        return {key: text(item, f"{where}[{key!r}]") for key, item in mapping(value, where).items()}
    return text(value, where)


_SPLIT_KV_RE = re.compile(r"^(none|heuristic|fixed_count:[1-9][0-9]*|fixed_size:[1-9][0-9]*)$")


def split_kv(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SPLIT_KV_RE.match(value):
        raise ContractError(f"{where}: expected none, heuristic, fixed_count:<n> or fixed_size:<tokens>, got {value!r}")
    return value


def choice(*choices: str) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if value not in choices:
            close = did_you_mean(value, choices) if isinstance(value, str) else None
            hint = f" (did you mean {close!r}?)" if close else ""
            raise ContractError(f"{where}: {value!r} is not one of {', '.join(choices)}{hint}")
        return value

    return check
