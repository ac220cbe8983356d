"""The ``attention_align:`` block of a NeMo-RL YAML, validated.

```yaml
attention_align:
  on_mismatch:                 # error | warn | record: one for both tiers, or per tier
    identity: error            # the two sides compute different functions (default error)
    semantic: warn             # the reduction differs (order, accumulation, dtype; default warn)
  preset: aligned              # optional: apply the settings that make both sides run one contract
  allow_dtype_difference: false
  strict: false                # true: a failure inside the plugin's own observability stops the run
  log_metrics: true            # log attention_align/* through NeMo-RL's Logger with each training step
  attention_estimate: true     # estimate at setup the drift attention alone adds (replays, CPU, seconds)
  report_dir: ${logger.log_dir}/attention_align   # the default
  mandate:                     # what the semantic tier demands; null for a key = no demand
    merge_rule: online_softmax_lse
    reduction_order: kv_index
    acc_dtype: fp32
    downcast: final_write
    dtype: bf16                # default: policy.precision
  drift:                       # attention shape for `nemo-rl-attn-align drift` (default: from the model)
    heads: 32
    kv_heads: 8
    head_dim: 128
    window: null
    seq_len: 2048
```

``on_mismatch``: what a failed binding does, per tier (``OnMismatch``; one word sets both): ``error``
stops the run, after writing the report, when that tier fails: when the algorithm's ``setup()`` has
returned ("step 0"), or at the first training step when Transformer Engine's read-back turns the
verdict to fail; ``warn`` prints the summary and continues; ``record`` only writes the report (and
prints where). By default an identity mismatch (the two sides' modules compute different functions,
or read different models) stops the run and a semantic one warns.
Every bad value raises ``UsageError`` with one line naming the full dotted key, the value and the
fix (all bad keys of the block on that line). Stdlib only: ``check`` reads this block in well under a
millisecond, and the NeMo-RL driver hook imports nothing heavy for it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.config.loader import get_path
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.kinds import dtype_or_none
from nemo_rl_attn_align.vocab.limits import shown, shown_text
from nemo_rl_attn_align.vocab.mandate import Mandate
from nemo_rl_attn_align.vocab.names import BLOCK
from nemo_rl_attn_align.vocab.schema import ContractError, field_spec
from nemo_rl_attn_align.vocab.suggest import did_you_mean

#: ``on_mismatch`` modes, strictest first.
ON_MISMATCH = ("error", "warn", "record")
#: The binding tiers ``on_mismatch`` acts on (the recorded tier never fails).
ON_MISMATCH_TIERS = ("identity", "semantic")
PRESETS = ("aligned",)
#: Directory name of the report under ``logger.log_dir`` when ``report_dir`` is not set.
REPORT_SUBDIR = BLOCK
MANDATE_KEYS = ("merge_rule", "reduction_order", "acc_dtype", "downcast", "dtype")


@dataclass(frozen=True)
class DriftSettings:
    """``attention_align.drift``: the attention shape ``drift`` sweeps when the model does not give it."""

    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    window: int | None = None
    seq_len: int | None = None


@dataclass(frozen=True)
class OnMismatch:
    """``attention_align.on_mismatch``: the mode for a failed identity tier and for a failed semantic
    tier (a blocking determinism difference counts as semantic)."""

    identity: str = "error"
    semantic: str = "warn"

    @classmethod
    def of(cls, value: Any) -> OnMismatch:
        """The modes of a checked value: one mode for both tiers, or a mapping tier -> mode (a tier
        left out keeps its default). Raises ``ValueError`` for anything else."""
        if isinstance(value, str) and value in ON_MISMATCH:
            return cls(value, value)
        if isinstance(value, Mapping) and set(value) <= set(ON_MISMATCH_TIERS):
            if all(isinstance(mode, str) and mode in ON_MISMATCH for mode in value.values()):
                return cls(**{str(tier): mode for tier, mode in value.items()})
        raise ValueError(f"on_mismatch {shown(value)} is not one of {', '.join(ON_MISMATCH)} or a mapping of tiers")

    def applied(self, failed: Any = ()) -> str:
        """The mode that applies: the strictest of the ``failed`` tiers' modes, or of every tier's
        when none failed (what the run would do if one did)."""
        tiers = [tier for tier in ON_MISMATCH_TIERS if tier in failed] or list(ON_MISMATCH_TIERS)
        return min((getattr(self, tier) for tier in tiers), key=ON_MISMATCH.index)

    def text(self) -> str:
        """``error`` when both tiers agree, else ``identity error, semantic warn``."""
        if self.identity == self.semantic:
            return self.identity
        return ", ".join(f"{tier} {getattr(self, tier)}" for tier in ON_MISMATCH_TIERS)

    def to_dict(self) -> dict[str, str]:
        return {tier: getattr(self, tier) for tier in ON_MISMATCH_TIERS}


@dataclass(frozen=True)
class AlignSettings:
    """The validated ``attention_align`` block (``report_dir`` and ``mandate.dtype`` resolved by
    ``load_settings``)."""

    on_mismatch: OnMismatch = field(default_factory=OnMismatch)
    preset: str | None = None
    allow_dtype_difference: bool = False
    strict: bool = False
    log_metrics: bool = True
    attention_estimate: bool = True
    report_dir: str = REPORT_SUBDIR
    mandate: Mandate = field(default_factory=Mandate)
    drift: DriftSettings = field(default_factory=DriftSettings)

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values (what ``check --json`` prints)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> AlignSettings:
        """A copy with ``changes`` applied (the settings are frozen)."""
        return dataclasses.replace(self, **changes)


class _Invalid(ValueError):
    """A value a key cannot take; the message says why (the key and value are added by the caller)."""


def _choice(choices: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices or not isinstance(value, str):
            close = did_you_mean(value, choices) if isinstance(value, str) else None
            hint = f" (did you mean {close!r}?)" if close else ""
            raise _Invalid(f"must be one of {', '.join(choices)}{hint}")
        return value

    return check


def _on_mismatch(value: Any) -> OnMismatch:
    if isinstance(value, Mapping):
        unknown = [str(tier) for tier in value if tier not in ON_MISMATCH_TIERS]
        if unknown:
            raise _Invalid(f"has no tier {shown(unknown[0])} (tiers: {', '.join(ON_MISMATCH_TIERS)})")
        for mode in value.values():
            _choice(ON_MISMATCH)(mode)
        return OnMismatch.of(dict(value))
    return OnMismatch.of(_choice(ON_MISMATCH)(value))


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("must be true or false")
    return value


def _integer(minimum: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid("must be an integer, unquoted")
        if value < minimum:
            raise _Invalid(f"must be {minimum} or more")
        return value

    return check


def _report_dir(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("must be a non-empty path string")
    if "\0" in value:
        raise _Invalid("must not contain a NUL character")
    return os.path.normpath(value)  # X/../Y is Y: creating the directory must not leave an empty X behind


def _mandate_value(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        try:
            return field_spec(name).validate(value)
        except ContractError as err:
            raise _Invalid(str(err).split(": ", 1)[-1]) from None

    return _optional(check)


_FIXES = {
    "on_mismatch": f"set {BLOCK}.on_mismatch to one of {', '.join(ON_MISMATCH)}, or to a mapping "
    f"{{identity: MODE, semantic: MODE}} of them",
    "preset": f"set {BLOCK}.preset to aligned, or remove it",
    "allow_dtype_difference": f"set {BLOCK}.allow_dtype_difference to true or false (a YAML boolean, unquoted)",
    "strict": f"set {BLOCK}.strict to true or false (a YAML boolean, unquoted)",
    "log_metrics": f"set {BLOCK}.log_metrics to true or false (a YAML boolean, unquoted)",
    "attention_estimate": f"set {BLOCK}.attention_estimate to true or false (a YAML boolean, unquoted)",
    "report_dir": f"set {BLOCK}.report_dir to a directory path, or remove it for <logger.log_dir>/{REPORT_SUBDIR}",
    "mandate": f"set {BLOCK}.mandate to a mapping of {', '.join(MANDATE_KEYS)}",
    "drift": f"set {BLOCK}.drift.<key> to a positive integer, unquoted (window: 0 or more), or remove it",
}
_POSITIVE = _optional(_integer(1))
#: Each section's keys and how each value is checked (``None``: a nested section).
_SECTIONS: dict[str, dict[str, Callable[[Any], Any] | None]] = {
    "": {
        "on_mismatch": _on_mismatch,
        "preset": _optional(_choice(PRESETS)),
        "allow_dtype_difference": _boolean,
        "strict": _boolean,
        "log_metrics": _boolean,
        "attention_estimate": _boolean,
        "report_dir": _optional(_report_dir),
        "mandate": None,
        "drift": None,
    },
    "mandate": {name: _mandate_value(name) for name in MANDATE_KEYS},
    "drift": {
        "heads": _POSITIVE,
        "kv_heads": _POSITIVE,
        "head_dim": _POSITIVE,
        "window": _optional(_integer(0)),
        "seq_len": _POSITIVE,
    },
}


def _dotted(*parts: str) -> str:
    return shown_text(".".join((BLOCK, *(p for p in parts if p))))


def _read_section(section: str, block: Mapping[Any, Any], errors: list[str]) -> dict[str, Any]:
    """The valid values of one section; a line for each bad key appended to ``errors``."""
    known = _SECTIONS[section]
    values: dict[str, Any] = {}
    for raw_key, value in block.items():
        key = str(raw_key)
        if key not in known:
            close = did_you_mean(key, tuple(known))
            hint = f" (did you mean {_dotted(section, close)}?)" if close else ""
            errors.append(
                f"{_dotted(section, key)}: unknown key{hint}. Fix: remove it; known keys here: {', '.join(known)}"
            )
            continue
        check = known[key]
        if check is None:  # a nested section
            if isinstance(value, Mapping):
                values[key] = _read_section(key, value, errors)
            elif value is not None:
                errors.append(f"{_dotted(key)}={shown(value)}: must be a mapping. Fix: {_FIXES[key]}.")
            continue
        try:
            values[key] = check(value)
        except _Invalid as err:
            fix = (
                f"set {_dotted(section, key)} to an allowed value, or null for no demand"
                if section == "mandate"
                else _FIXES[section or key]
            )
            errors.append(f"{_dotted(section, key)}={shown(value)}: {shown_text(str(err))}. Fix: {fix}.")
    return values


def load_settings(cfg: Mapping[str, Any]) -> AlignSettings:
    """The validated, resolved ``attention_align`` settings of a resolved NeMo-RL config.

    ``mandate.dtype`` not given: ``policy.precision`` (normalized, e.g. bfloat16 -> bf16);
    ``report_dir`` not given: ``<logger.log_dir>/attention_align`` (``attention_align`` under the
    working directory when the config has no ``logger.log_dir``). Raises ``UsageError``.
    """
    block = cfg.get(BLOCK) if isinstance(cfg, Mapping) else None
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise UsageError(
            f"{BLOCK}={shown(block)}: must be a mapping. Fix: write `{BLOCK}:` followed by indented keys "
            f"({', '.join(_SECTIONS[''])}), or remove it."
        )
    errors: list[str] = []
    values = _read_section("", block, errors)
    if errors:
        raise UsageError("; ".join(errors))
    mandate, drift = values.pop("mandate", {}), values.pop("drift", {})
    if "dtype" not in mandate:
        mandate["dtype"] = dtype_or_none(get_path(cfg, "policy.precision", None))  # invalid: the rules say so
    if values.get("report_dir") is None:
        log_dir = get_path(cfg, "logger.log_dir", None)
        values["report_dir"] = (
            os.path.join(log_dir, REPORT_SUBDIR) if isinstance(log_dir, str) and log_dir else REPORT_SUBDIR
        )
    return AlignSettings(**values, mandate=Mandate(**mandate), drift=DriftSettings(**drift))
