"""Pre-flight rules on values: a key the rules read whose value no host can use at all.

``VALUE_CHECKS`` is the table of them (key, where the value comes from, what makes it unusable,
the fix), in the order they are reported; ``_config_values`` runs it. A key NeMo-RL indexes without
a default, the attention backend's name and the precisions have rules of their own below. The rules
on combinations of usable values are in ``combinations.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, CP_COMM_TYPES
from nemo_rl_attn_align.preflight.facts import (
    COUNT_KEYS,
    LAYOUT,
    PRECISIONS,
    SOFTMAX_TYPES,
    TRANSFORMER_IMPLS,
    UNSET,
    PolicyFacts,
    is_count,
)
from nemo_rl_attn_align.preflight.rules.registry import (
    BACKEND_KEY,
    MEGATRON_KEY,
    rule,
    truthy,
    type_name,
)
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding
from nemo_rl_attn_align.vocab.limits import shown
from nemo_rl_attn_align.vocab.suggest import describe_invalid

PRECISION_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
OVERRIDES_KEY = f"{MEGATRON_KEY}.model_overrides"

#: Why a value cannot be used (one sentence, without the key), or None when it can.
Problem = Callable[[Any], str | None]


@dataclass(frozen=True)
class ValueCheck:
    """One key whose value must have a usable type or be one of a set: where to read it (``UNSET``
    when the recipe does not set it), what is wrong with a bad one, the fix; ``applies`` says when the
    host reads the key at all, ``code`` is ``CONFIG_VALUE_INVALID`` unless the value merely misleads."""

    key: str
    read: Callable[[PolicyFacts], Any]
    problem: Problem
    fix: str
    applies: Callable[[PolicyFacts], bool] = lambda facts: facts.megatron_enabled
    code: Code = Code.CONFIG_VALUE_INVALID


def _override(name: str, *, null_is_unset: bool = True) -> Callable[[PolicyFacts], Any]:
    def read(facts: PolicyFacts) -> Any:
        value = facts.model_overrides.get(name, UNSET)
        return UNSET if value is None and null_is_unset else value

    return read


def _not_model_id(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return f"is {type_name(value)}, not a model id; NeMo-RL loads the model's Hugging Face config from it."


def _not_count(value: Any) -> str | None:
    if is_count(value):
        return None
    integer = isinstance(value, int) and not isinstance(value, bool)
    why = "is below 1" if integer else f"is {type_name(value)}, not an integer"
    return (
        f"{why}; NeMo-RL lays its workers out with np.arange(world_size).reshape(...) of it, which takes only "
        "integers (no conversion: '2', 2.0 and true are not 2 or 1; YAML reads yes and on as true)."
    )


def _one_of(names: Sequence[str], where: str) -> Problem:
    def problem(value: Any) -> str | None:
        return None if isinstance(value, str) and value in names else f"{describe_invalid(value, names)} ({where})."

    return problem


def _not_mapping(consequence: str) -> Problem:
    """A mapping NeMo-RL iterates; null and an empty value mean none (as NeMo-RL's ``or {}``)."""

    def problem(value: Any) -> str | None:
        if value is None or isinstance(value, dict) or not truthy(value):
            return None
        return f"is {type_name(value)}, not a mapping; {consequence}"

    return problem


def _not_cp_comm_type(value: Any) -> str | None:
    values = value if isinstance(value, list) else [value]
    if values and all(isinstance(v, str) and v in CP_COMM_TYPES for v in values):
        return None
    return (
        f"is not one of {', '.join(CP_COMM_TYPES)} (or a list of them, one per layer); Transformer "
        "Engine's context-parallel attention accepts only these."
    )


def _not_boolean(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    return (
        f"is {type_name(value)}, not true/false; Megatron reads it by truthiness (`if "
        f"config.batch_invariant_mode:`), so {shown(value)} turns batch-invariant mode "
        f"{'on' if truthy(value) else 'off'} and the checks follow that."
    )


def _cp_attention(facts: PolicyFacts) -> bool:
    """Transformer Engine's context-parallel attention runs (it reads ``cp_comm_type``)."""
    return facts.megatron_enabled and facts.context_parallel_size > 1 and facts.transformer_impl != "local"


#: The value checks, in the order their findings are reported.
VALUE_CHECKS = (
    ValueCheck(
        "policy.model_name",
        attrgetter("model_name_raw"),
        _not_model_id,
        "set policy.model_name to a Hugging Face model id or path.",
        applies=lambda facts: True,
    ),
    ValueCheck(
        f"{MEGATRON_KEY}.transformer_impl",
        attrgetter("transformer_impl_raw"),
        _one_of(TRANSFORMER_IMPLS, "megatron-core's TransformerConfig.transformer_impl"),
        "set transformer_impl to transformer_engine (the default), local or inference_optimized.",
    ),
    ValueCheck(
        OVERRIDES_KEY,
        attrgetter("model_overrides_raw"),
        _not_mapping("NeMo-RL iterates model_overrides.items() and fails."),
        "write model_overrides as a mapping of TransformerConfig fields, or remove it.",
    ),
    ValueCheck(
        f"{MEGATRON_KEY}.env_vars",
        attrgetter("env_vars_raw"),
        _not_mapping("NeMo-RL builds dict(env_vars) for the workers."),
        "write env_vars as a mapping of NAME: value, or remove it.",
    ),
    ValueCheck(
        f"{OVERRIDES_KEY}.softmax_type",
        _override("softmax_type"),
        _one_of(SOFTMAX_TYPES, "megatron-core's TransformerConfig.softmax_type"),
        "set softmax_type to vanilla, off-by-one or learnable.",
    ),
    ValueCheck(
        f"{OVERRIDES_KEY}.cp_comm_type",
        _override("cp_comm_type"),
        _not_cp_comm_type,
        "set cp_comm_type to p2p (Megatron's default), all_gather, a2a or a2a+p2p, or remove it.",
        applies=_cp_attention,
    ),
    ValueCheck(
        f"{OVERRIDES_KEY}.batch_invariant_mode",
        _override("batch_invariant_mode", null_is_unset=False),
        _not_boolean,
        "write batch_invariant_mode: true or false (unquoted).",
        code=Code.FLAG_NOT_BOOLEAN,
    ),
)


def _count_findings(facts: PolicyFacts) -> list[Finding]:
    """The counts and sizes the facts read (``facts.COUNT_KEYS``): a value NeMo-RL's worker layout
    cannot take is an error, a boolean the host would read as 1 or 0 a warning."""
    out = []
    for fact in facts.counts:
        name = fact.key.rpartition(".")[2]
        if COUNT_KEYS[fact.key.removeprefix("policy.")] == LAYOUT:
            why = _not_count(fact.value)
            if why is not None:
                fix = f"set {name} to 1, 2, 4, ... (an unquoted integer)."
                out.append(finding(Code.CONFIG_VALUE_INVALID, fact.key, fact.value, why, fix))
        elif isinstance(fact.value, bool):
            spelled = str(fact.value).lower()
            why = f"is a boolean where the host needs a number; it takes {spelled} as {int(fact.value)}."
            fix = f"write {name} as an unquoted integer."
            out.append(finding(Code.NUMBER_IS_BOOLEAN, fact.key, fact.value, why, fix))
    return out


@rule(Code.CONFIG_VALUE_INVALID, Code.FLAG_NOT_BOOLEAN, Code.NUMBER_IS_BOOLEAN)
def _config_values(facts: PolicyFacts) -> list[Finding]:
    """Values of the keys the rules read that NeMo-RL or Megatron cannot use at all
    (``VALUE_CHECKS``) and the counts and sizes the facts read (``_count_findings``); a
    ``policy.megatron_cfg`` that is not a mapping hides every other one."""
    megatron_cfg = facts.megatron_cfg_raw
    if megatron_cfg is not UNSET and not isinstance(megatron_cfg, dict):
        return [
            finding(
                Code.CONFIG_VALUE_INVALID,
                MEGATRON_KEY,
                megatron_cfg,
                f"is {type_name(megatron_cfg)}, not a mapping; NeMo-RL reads policy.megatron_cfg.get('enabled') "
                "and fails.",
                "write policy.megatron_cfg as a mapping (enabled: true, attention_backend: ...), or remove it.",
            )
        ]
    out = []
    for check in VALUE_CHECKS:
        value = check.read(facts) if check.applies(facts) else UNSET
        why = check.problem(value) if value is not UNSET else None
        if why is not None:
            out.append(finding(check.code, check.key, value, why, check.fix))
    return out + _count_findings(facts)


@rule(Code.MEGATRON_KEY_MISSING)
def _indexed_keys(facts: PolicyFacts) -> list[Finding]:
    """Keys NeMo-RL's ``Policy`` indexes without a default when Megatron is enabled
    (``facts.MEGATRON_INDEXED_KEYS``) that the recipe does not set."""
    if not facts.megatron_enabled:
        return []
    return [
        finding(
            Code.MEGATRON_KEY_MISSING,
            f"{MEGATRON_KEY}.{key}",
            UNSET,
            f"is missing; with Megatron enabled NeMo-RL's Policy reads config['megatron_cfg']['{key}'] without a "
            f"default (nemo_rl/models/policy/lm_policy.py), so the run stops with KeyError: '{key}' before any "
            "worker starts.",
            f"add {MEGATRON_KEY}.{key}: {value} to the recipe (or ++{MEGATRON_KEY}.{key}={value} on the command line).",
        )
        for key, value in facts.missing_indexed
    ]


@rule(Code.ATTN_BACKEND_NULL, Code.ATTN_BACKEND_INVALID)
def _backend_value(facts: PolicyFacts) -> list[Finding]:
    raw = facts.backend_raw
    if raw is UNSET:
        return []
    if raw is None:
        return [
            finding(
                Code.ATTN_BACKEND_NULL,
                BACKEND_KEY,
                None,
                "null is treated by NeMo-RL as unset, so Megatron's default backend (auto) applies.",
                "remove the key, or set one of flash, fused, unfused, local, auto.",
            )
        ]
    if facts.backend is None:
        return [
            finding(
                Code.ATTN_BACKEND_INVALID,
                BACKEND_KEY,
                raw,
                describe_invalid(raw, BACKEND_NAMES) + ".",
                "set policy.megatron_cfg.attention_backend to one of flash, fused, unfused, local, auto.",
            )
        ]
    return []


@rule(Code.PRECISION_INVALID)
def _precision_values(facts: PolicyFacts) -> list[Finding]:
    out = []
    checks = [("policy.precision", facts.precision_raw)]
    if facts.megatron_enabled:
        checks.append((f"{MEGATRON_KEY}.pipeline_dtype", facts.pipeline_dtype_raw))
    for key, raw in checks:
        if raw is UNSET:
            # A missing key is the host's business: NeMo-RL's own validation and defaults decide,
            # and no rule here can prove that the run fails without it.
            continue
        if raw not in PRECISIONS:
            out.append(
                finding(
                    Code.PRECISION_INVALID,
                    key,
                    raw,
                    describe_invalid(raw, PRECISIONS, PRECISION_ALIASES) + ".",
                    f"set {key} to bfloat16 (recommended), float16 or float32.",
                )
            )
    return out
