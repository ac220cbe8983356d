"""The ``attention_align:`` block of a NeMo-RL YAML, validated.

```yaml
attention_align:
  on_mismatch: warn            # error | warn | record (default warn)
  preset: aligned              # optional: apply the settings that make both sides run one contract
  allow_dtype_difference: false
  strict: false                # true: a failure inside the plugin's own observability stops the run
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

``on_mismatch``: ``error`` stops the run, after writing the report, when the binding fails: when
the algorithm's ``setup()`` has returned, or at the first training step when Transformer Engine's
read-back turns the verdict to fail; ``warn`` prints the summary and continues; ``record`` only
writes the report (and prints where).
Every bad value raises ``UsageError`` with one line naming the full dotted key, the value and the
fix. Importing this module imports pydantic (~70 ms): keep it off interpreter start-up.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Mapping, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from nemo_rl_attn_align.compare.binding import Mandate
from nemo_rl_attn_align.config.loader import get_path
from nemo_rl_attn_align.contract.schema import ContractError, field_spec, normalize_dtype
from nemo_rl_attn_align.errors import UsageError
from nemo_rl_attn_align.limits import shown, shown_text
from nemo_rl_attn_align.suggest import did_you_mean

BLOCK = "attention_align"
OnMismatch = Literal["error", "warn", "record"]
ON_MISMATCH = get_args(OnMismatch)
Preset = Literal["aligned"]
#: Directory name of the report under ``logger.log_dir`` when ``report_dir`` is not set.
REPORT_SUBDIR = "attention_align"
#: Integers as written: ``true``, ``'32'`` and ``2.0`` are refused, never coerced.
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class MandateSettings(BaseModel):
    """``attention_align.mandate``: one key per semantic field; ``null`` means no demand."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    merge_rule: Optional[str] = Mandate.merge_rule
    reduction_order: Optional[str] = Mandate.reduction_order
    acc_dtype: Optional[str] = Mandate.acc_dtype
    downcast: Optional[str] = Mandate.downcast
    dtype: Optional[str] = None

    @field_validator("merge_rule", "reduction_order", "acc_dtype", "downcast", "dtype", mode="before")
    @classmethod
    def _known_value(cls, value: Any, info) -> Any:
        if value is None:
            return None
        try:
            return field_spec(info.field_name).validate(value)
        except ContractError as err:
            raise ValueError(str(err).split(": ", 1)[-1]) from None

    def to_mandate(self) -> Mandate:
        """The stdlib ``binding.Mandate`` with these demands."""
        return Mandate(**self.model_dump())


class DriftSettings(BaseModel):
    """``attention_align.drift``: the attention shape ``drift`` sweeps when the model does not give it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    heads: Optional[PositiveInt] = None
    kv_heads: Optional[PositiveInt] = None
    head_dim: Optional[PositiveInt] = None
    window: Optional[NonNegativeInt] = None
    seq_len: Optional[PositiveInt] = None


class AlignSettings(BaseModel):
    """The validated ``attention_align`` block (``report_dir`` and ``mandate.dtype`` resolved by
    ``load_settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_mismatch: OnMismatch = "warn"
    preset: Optional[Preset] = None
    allow_dtype_difference: StrictBool = False
    strict: StrictBool = False
    report_dir: Optional[str] = None
    mandate: MandateSettings = MandateSettings()
    drift: DriftSettings = DriftSettings()

    @field_validator("report_dir", mode="before")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError("must be a non-empty path string")
        if value is not None and "\0" in value:
            raise ValueError("must not contain a NUL character")
        # X/../Y is Y: creating the directory must not leave an empty X behind.
        return os.path.normpath(value) if value is not None else None

    def to_mandate(self) -> Mandate:
        return self.mandate.to_mandate()


_FIXES = {
    "on_mismatch": f"set {BLOCK}.on_mismatch to one of {', '.join(ON_MISMATCH)}",
    "preset": f"set {BLOCK}.preset to aligned, or remove it",
    "allow_dtype_difference": f"set {BLOCK}.allow_dtype_difference to true or false (a YAML boolean, unquoted)",
    "strict": f"set {BLOCK}.strict to true or false (a YAML boolean, unquoted)",
    "report_dir": f"set {BLOCK}.report_dir to a directory path, or remove it for <logger.log_dir>/{REPORT_SUBDIR}",
    "mandate": f"set {BLOCK}.mandate to a mapping of merge_rule, reduction_order, acc_dtype, downcast, dtype",
    "drift": f"set {BLOCK}.drift.<key> to a positive integer, unquoted (window: 0 or more), or remove it",
}


def _model_keys(loc: tuple) -> tuple[str, ...]:
    node: Any = AlignSettings
    for part in loc[:-1]:
        node = node.model_fields[part].annotation
    return tuple(node.model_fields)


def _error_line(error: Mapping[str, Any]) -> str:
    loc = tuple(str(part) for part in error["loc"])
    key = shown_text(".".join((BLOCK,) + loc))
    if error["type"] == "extra_forbidden":
        known = _model_keys(loc)
        close = did_you_mean(loc[-1], known)
        hint = f" (did you mean {'.'.join((BLOCK,) + loc[:-1] + (close,))}?)" if close else ""
        return f"{key}: unknown key{hint}. Fix: remove it; known keys here: {', '.join(known)}"
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if loc[0] == "mandate" and len(loc) == 2:
        fix = f"set {key} to an allowed value, or null for no demand"
    else:
        fix = _FIXES.get(loc[0], f"correct {key}")
    if error["type"] == "literal_error" and isinstance(value, str):
        close = did_you_mean(value, get_args(Preset) if loc[0] == "preset" else ON_MISMATCH)
        message += f" (did you mean {close!r}?)" if close else ""
    return f"{key}={shown(value)}: {shown_text(message)}. Fix: {fix}."


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
            f"(on_mismatch, preset, allow_dtype_difference, strict, report_dir, mandate, drift), or remove it."
        )
    try:
        settings = AlignSettings.model_validate(dict(block))
    except ValidationError as err:
        raise UsageError("; ".join(_error_line(e) for e in err.errors())) from None
    updates: dict[str, Any] = {}
    if settings.report_dir is None:
        log_dir = get_path(cfg, "logger.log_dir", None)
        updates["report_dir"] = os.path.join(log_dir, REPORT_SUBDIR) if isinstance(log_dir, str) and log_dir else REPORT_SUBDIR
    if "dtype" not in settings.mandate.model_fields_set:
        precision = get_path(cfg, "policy.precision", None)
        try:
            dtype = normalize_dtype(precision) if precision is not None else None
        except ContractError:
            dtype = None  # an invalid policy.precision is the pre-flight rules' finding, not ours
        updates["mandate"] = settings.mandate.model_copy(update={"dtype": dtype})
    return settings.model_copy(update=updates)
