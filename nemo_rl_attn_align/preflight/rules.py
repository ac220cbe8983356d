"""Pre-flight rules: attention settings that cannot work, caught before any GPU work.

Each rule reads ``PolicyFacts`` (what the policy config and the environment say, already read by
``facts.read_policy_facts``) and returns ``Finding`` objects with a stable ``Code``. A rule is a
function registered with ``@rule(Code.X, ...)`` (the codes it raises); ``evaluate`` runs the rules
in the order they are defined here. Each code's severity and summary are in ``codes.Code``, which
the README's rule table is generated from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_rl_attn_align.codes import Code, Kind
from nemo_rl_attn_align.contract.semantics import CP_COMM_TYPES
from nemo_rl_attn_align.errors import Finding
from nemo_rl_attn_align.limits import shown
from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, HALF_PRECISION_ONLY, NVTE_BY_BACKEND
from nemo_rl_attn_align.preflight.facts import (
    LEARNABLE_SOFTMAX_MODELS,
    PRECISIONS,
    SOFTMAX_TYPES,
    TRANSFORMER_IMPLS,
    UNSET,
    PolicyFacts,
    is_count,
)
from nemo_rl_attn_align.suggest import describe_invalid

PRECISION_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}

MEGATRON_KEY = "policy.megatron_cfg"
BACKEND_KEY = f"{MEGATRON_KEY}.attention_backend"
CP_KEY = f"{MEGATRON_KEY}.context_parallel_size"


def finding(code: Code, key: str, value: Any, message: str, fix: str) -> Finding:
    """A ``Finding`` with the code's own severity (from the registry)."""
    return Finding(code.value, code.severity, key, value, message, fix)


Rule = Callable[[PolicyFacts], list[Finding]]
#: Every rule with the codes it raises, in definition order (the order findings are reported).
RULES: list[tuple[Rule, tuple[Code, ...]]] = []


def rule(*codes: Code) -> Callable[[Rule], Rule]:
    """Register the decorated function as a rule that raises ``codes`` (each a rule code)."""
    wrong = [code for code in codes if code.kind is not Kind.RULE]
    if not codes or wrong:
        raise ValueError(f"a rule raises rule codes, got {wrong or 'none'}")

    def register(function: Rule) -> Rule:
        RULES.append((function, codes))
        return function

    return register


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _invalid(key: str, value: Any, why: str, fix: str) -> Finding:
    return finding(Code.CONFIG_VALUE_INVALID, key, value, why, fix)


@rule(Code.CONFIG_VALUE_INVALID, Code.FLAG_NOT_BOOLEAN)
def _config_values(facts: PolicyFacts) -> list[Finding]:
    """Values of the keys the rules read that NeMo-RL or Megatron cannot use at all."""
    raw = facts.raw
    megatron_cfg = raw.get("megatron_cfg", UNSET)
    if megatron_cfg is not UNSET and not isinstance(megatron_cfg, dict):
        return [
            _invalid(
                MEGATRON_KEY,
                megatron_cfg,
                f"is {_type_name(megatron_cfg)}, not a mapping; NeMo-RL reads policy.megatron_cfg.get('enabled') and "
                f"fails.",
                "write policy.megatron_cfg as a mapping (enabled: true, attention_backend: ...), or remove it.",
            )
        ]
    out = []
    name = raw.get("model_name", UNSET)
    if name is not UNSET and not (isinstance(name, str) and name.strip()):
        out.append(
            _invalid(
                "policy.model_name",
                name,
                f"is {_type_name(name)}, not a model id; NeMo-RL loads the model's Hugging Face config from it.",
                "set policy.model_name to a Hugging Face model id or path.",
            )
        )
    if not facts.megatron_enabled:
        return out
    cp = raw.get("context_parallel_size", UNSET)
    if cp is not UNSET and not is_count(cp):
        why = "is below 1" if isinstance(cp, int) else f"is {_type_name(cp)}, not an integer"
        out.append(
            _invalid(
                CP_KEY,
                cp,
                f"{why}; NeMo-RL compares it with 1 and Megatron divides the world size by it "
                "(no conversion: '2' and 2.0 are not 2).",
                "set context_parallel_size to 1, 2, 4, ... (an unquoted integer).",
            )
        )
    impl = raw.get("transformer_impl", UNSET)
    if impl is not UNSET and not (isinstance(impl, str) and impl in TRANSFORMER_IMPLS):
        out.append(
            _invalid(
                f"{MEGATRON_KEY}.transformer_impl",
                impl,
                f"{describe_invalid(impl, TRANSFORMER_IMPLS)} (megatron-core's TransformerConfig.transformer_impl).",
                "set transformer_impl to transformer_engine (the default), local or inference_optimized.",
            )
        )
    overrides = raw.get("model_overrides", UNSET)
    if overrides not in (UNSET, None) and not isinstance(overrides, dict) and _truthy(overrides):
        out.append(
            _invalid(
                f"{MEGATRON_KEY}.model_overrides",
                overrides,
                f"is {_type_name(overrides)}, not a mapping; NeMo-RL iterates model_overrides.items() and fails.",
                "write model_overrides as a mapping of TransformerConfig fields, or remove it.",
            )
        )
    env_vars = raw.get("env_vars", UNSET)
    if env_vars not in (UNSET, None) and not isinstance(env_vars, dict) and _truthy(env_vars):
        out.append(
            _invalid(
                f"{MEGATRON_KEY}.env_vars",
                env_vars,
                f"is {_type_name(env_vars)}, not a mapping; NeMo-RL builds dict(env_vars) for the workers.",
                "write env_vars as a mapping of NAME: value, or remove it.",
            )
        )
    out.extend(_override_values(facts))
    return out


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


def _truthy(value: Any) -> bool:
    try:
        return bool(value)
    except Exception:
        return True


def _override_values(facts: PolicyFacts) -> list[Finding]:
    """``model_overrides`` values megatron-core cannot take, and flags it reads by truthiness."""
    overrides, out = facts.model_overrides, []
    key = f"{MEGATRON_KEY}.model_overrides"
    softmax = overrides.get("softmax_type")
    if softmax is not None and not (isinstance(softmax, str) and softmax in SOFTMAX_TYPES):
        out.append(
            _invalid(
                f"{key}.softmax_type",
                softmax,
                f"{describe_invalid(softmax, SOFTMAX_TYPES)} (megatron-core's TransformerConfig.softmax_type).",
                "set softmax_type to vanilla, off-by-one or learnable.",
            )
        )
    comm = overrides.get("cp_comm_type")
    comms = comm if isinstance(comm, list) else [comm]
    if (
        comm is not None
        and facts.context_parallel_size > 1
        and facts.transformer_impl != "local"
        and not (comms and all(isinstance(c, str) and c in CP_COMM_TYPES for c in comms))
    ):
        out.append(
            _invalid(
                f"{key}.cp_comm_type",
                comm,
                f"is not one of {', '.join(CP_COMM_TYPES)} (or a list of them, one "
                "per layer); Transformer Engine's context-parallel attention accepts only these.",
                "set cp_comm_type to p2p (Megatron's default), all_gather, a2a or a2a+p2p, or remove it.",
            )
        )
    flag = overrides.get("batch_invariant_mode")
    if "batch_invariant_mode" in overrides and not isinstance(flag, bool):
        state = "on" if _truthy(flag) else "off"
        out.append(
            finding(
                Code.FLAG_NOT_BOOLEAN,
                f"{key}.batch_invariant_mode",
                flag,
                f"is {_type_name(flag)}, not true/false; Megatron reads it by truthiness (`if "
                f"config.batch_invariant_mode:`), so {shown(flag)} turns batch-invariant mode {state} and the "
                "checks follow that.",
                "write batch_invariant_mode: true or false (unquoted).",
            )
        )
    return out


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


@rule(Code.FLASH_REQUIRES_HALF_PRECISION, Code.FUSED_REQUIRES_HALF_PRECISION)
def _half_precision(facts: PolicyFacts) -> list[Finding]:
    backend = facts.backend
    if (
        not facts.megatron_enabled
        or backend not in HALF_PRECISION_ONLY
        or facts.precision != "float32"
        or facts.transformer_impl == "local"
    ):
        return []
    code = Code.FLASH_REQUIRES_HALF_PRECISION if backend == "flash" else Code.FUSED_REQUIRES_HALF_PRECISION
    return [
        finding(
            code,
            "policy.precision",
            "float32",
            f"attention_backend={backend} runs only in fp16/bf16; with float32 Transformer Engine finds no "
            "attention backend at the first forward, after all the setup.",
            "set policy.precision=bfloat16 (float16 also works), or use attention_backend=unfused for FP32.",
        )
    ]


@rule(Code.PRECISION_OVERRIDE_IGNORED)
def _precision_overrides(facts: PolicyFacts) -> list[Finding]:
    # setup.py::setup_model_config merges model_overrides first, then _apply_precision_config sets
    # bf16/fp16/params_dtype from policy.precision (NeMo-RL 7ea279a), so these overrides never stick.
    keys = [k for k in ("params_dtype", "bf16", "fp16") if k in facts.model_overrides]
    if not facts.megatron_enabled or not keys:
        return []
    key = f"{MEGATRON_KEY}.model_overrides.{keys[0]}"
    return [
        finding(
            Code.PRECISION_OVERRIDE_IGNORED,
            key,
            facts.model_overrides[keys[0]],
            f"NeMo-RL overwrites {', '.join(keys)} from policy.precision={facts.precision_raw!r} after "
            "applying model_overrides, so the checks use policy.precision.",
            "set policy.precision instead and remove the override.",
        )
    ]


@rule(Code.LOCAL_REQUIRES_LOCAL_SPEC, Code.BACKEND_IGNORED_BY_LOCAL_SPEC, Code.LOCAL_NO_CONTEXT_PARALLEL)
def _local_spec(facts: PolicyFacts) -> list[Finding]:
    if not facts.megatron_enabled:
        return []
    out = []
    impl_key = f"{MEGATRON_KEY}.transformer_impl"
    if facts.backend == "local" and facts.transformer_impl != "local":
        out.append(
            finding(
                Code.LOCAL_REQUIRES_LOCAL_SPEC,
                impl_key,
                facts.transformer_impl,
                "attention_backend=local sets NVTE_FLASH/FUSED/UNFUSED_ATTN=0, which leaves TE's "
                "DotProductAttention no backend; local needs Megatron's local layer spec.",
                "set policy.megatron_cfg.transformer_impl=local, or choose flash/fused/unfused/auto for TE.",
            )
        )
    if facts.transformer_impl == "local" and facts.backend not in (None, "local"):
        out.append(
            finding(
                Code.BACKEND_IGNORED_BY_LOCAL_SPEC,
                BACKEND_KEY,
                facts.backend,
                "with transformer_impl=local the layers use Megatron's own DotProductAttention; the "
                f"request only sets the NVTE variables, and {facts.backend} is never run.",
                "set attention_backend=local, or transformer_impl=transformer_engine to use TE's backends.",
            )
        )
    if facts.transformer_impl == "local" and facts.context_parallel_size > 1:
        out.append(
            finding(
                Code.LOCAL_NO_CONTEXT_PARALLEL,
                f"{MEGATRON_KEY}.context_parallel_size",
                facts.context_parallel_size,
                "megatron/core/transformer/dot_product_attention.py asserts context parallelism is "
                "supported only by TEDotProductAttention.",
                "set context_parallel_size=1, or transformer_impl=transformer_engine with a TE backend.",
            )
        )
    return out


@rule(Code.UNFUSED_NO_CONTEXT_PARALLEL, Code.FP32_CONTEXT_PARALLEL_NO_BACKEND)
def _context_parallel(facts: PolicyFacts) -> list[Finding]:
    # TE get_attention_backend: "Disabling UnfusedDotProductAttention as it does not support context
    # parallelism"; FP32 is left to Unfused alone ("Filter: Data type").
    if not facts.megatron_enabled or facts.context_parallel_size <= 1 or facts.transformer_impl == "local":
        return []
    key = f"{MEGATRON_KEY}.context_parallel_size"
    if facts.backend == "unfused":
        return [
            finding(
                Code.UNFUSED_NO_CONTEXT_PARALLEL,
                key,
                facts.context_parallel_size,
                "Transformer Engine disables UnfusedDotProductAttention under context parallelism, so "
                "attention_backend=unfused leaves no backend.",
                "use attention_backend=flash or fused with bfloat16, or set context_parallel_size=1.",
            )
        ]
    if facts.effective_backend == "auto" and facts.precision == "float32":
        return [
            finding(
                Code.FP32_CONTEXT_PARALLEL_NO_BACKEND,
                key,
                facts.context_parallel_size,
                "with policy.precision=float32 only UnfusedDotProductAttention qualifies, and it does not "
                "support context parallelism, so TE finds no backend.",
                "set policy.precision=bfloat16, or context_parallel_size=1.",
            )
        ]
    return []


@rule(Code.FLASH_UNSUPPORTED_SOFTMAX)
def _softmax_type(facts: PolicyFacts) -> list[Finding]:
    # TE get_attention_backend: "Disabling FlashAttention for softmax_type = learnable"; gpt-oss's Megatron
    # Bridge provider uses learnable attention sinks (NeMo-RL issue #1685).
    if not facts.megatron_enabled or facts.backend != "flash" or facts.transformer_impl == "local":
        return []
    softmax = facts.model_overrides.get("softmax_type")
    if softmax is not None and softmax in SOFTMAX_TYPES and softmax != "vanilla":
        return [
            finding(
                Code.FLASH_UNSUPPORTED_SOFTMAX,
                f"{MEGATRON_KEY}.model_overrides.softmax_type",
                softmax,
                "Transformer Engine's FlashAttention supports only softmax_type=vanilla.",
                "use attention_backend=fused or auto, or softmax_type=vanilla.",
            )
        ]
    if softmax is None and facts.model_name and LEARNABLE_SOFTMAX_MODELS.search(facts.model_name):
        return [
            finding(
                Code.FLASH_UNSUPPORTED_SOFTMAX,
                "policy.model_name",
                facts.model_name,
                "gpt-oss uses learnable softmax sinks, for which Transformer Engine disables FlashAttention.",
                "use attention_backend=fused or auto for gpt-oss.",
            )
        ]
    return []


@rule(Code.BATCH_INVARIANT_REQUIRES_FLASH, Code.BATCH_INVARIANT_REQUIRES_BF16, Code.BATCH_INVARIANT_NO_CONTEXT_PARALLEL)
def _batch_invariant(facts: PolicyFacts) -> list[Finding]:
    # megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ asserts flash
    # (megatron-core 0.16.1), context_parallel_size == 1 (core_v0.19.0, from Megatron-LM 51e915a) and
    # bf16 parameters (Megatron-LM main since 57deb43).
    if not facts.megatron_enabled or not _truthy(facts.model_overrides.get("batch_invariant_mode")):
        return []
    key = f"{MEGATRON_KEY}.model_overrides.batch_invariant_mode"
    out = []
    if facts.effective_backend not in (None, "flash"):
        out.append(
            finding(
                Code.BATCH_INVARIANT_REQUIRES_FLASH,
                BACKEND_KEY,
                facts.effective_backend,
                "batch_invariant_mode supports only FlashAttention (TransformerConfig asserts it).",
                "set policy.megatron_cfg.attention_backend=flash.",
            )
        )
    if facts.precision not in (None, "bfloat16"):
        out.append(
            finding(
                Code.BATCH_INVARIANT_REQUIRES_BF16,
                "policy.precision",
                facts.precision,
                f"{key}=true needs bfloat16.",
                "set policy.precision=bfloat16.",
            )
        )
    if facts.context_parallel_size > 1:
        out.append(
            finding(
                Code.BATCH_INVARIANT_NO_CONTEXT_PARALLEL,
                f"{MEGATRON_KEY}.context_parallel_size",
                facts.context_parallel_size,
                f"{key}=true needs context_parallel_size=1.",
                "set context_parallel_size=1 or turn batch_invariant_mode off.",
            )
        )
    return out


@rule(Code.MODEL_OVERRIDE_CONFLICT)
def _model_override_conflict(facts: PolicyFacts) -> list[Finding]:
    # setup.py::_validate_model_override_conflicts rejects overrides of first-class megatron_cfg keys.
    first_class = ("attention_backend", "transformer_impl", "context_parallel_size")
    return [
        finding(
            Code.MODEL_OVERRIDE_CONFLICT,
            f"{MEGATRON_KEY}.model_overrides.{name}",
            facts.model_overrides[name],
            f"NeMo-RL rejects model_overrides.{name} because policy.megatron_cfg.{name} is a first-class setting.",
            f"move it to policy.megatron_cfg.{name}.",
        )
        for name in first_class
        if facts.megatron_enabled and name in facts.model_overrides
    ]


@rule(Code.NVTE_ENV_DISCARDED, Code.NVTE_ENV_CONFLICT)
def _nvte_environment(facts: PolicyFacts) -> list[Finding]:
    # NeMo-RL >= 0.6 pops NVTE_FUSED/FLASH/UNFUSED_ATTN when attention_backend is set; otherwise
    # Megatron's _set_attention_backend asserts the values it finds equal the ones it would set.
    if not facts.megatron_enabled or facts.effective_backend is None:
        return []
    expected = NVTE_BY_BACKEND[facts.effective_backend]
    out = []
    for name, (value, source) in sorted(facts.nvte_env.items()):
        if value == expected[name]:
            continue
        if facts.backend is not None:
            out.append(
                finding(
                    Code.NVTE_ENV_DISCARDED,
                    source,
                    value,
                    f"NeMo-RL removes {name} before building the model because attention_backend is set; "
                    f"Megatron then sets {name}={expected[name]} for {facts.backend}.",
                    f"remove {name}; attention_backend alone chooses the backend.",
                )
            )
        else:
            out.append(
                finding(
                    Code.NVTE_ENV_CONFLICT,
                    source,
                    value,
                    f"Megatron sets {name}={expected[name]} for its default backend auto and asserts that "
                    "an existing value agrees, so the model build fails.",
                    f"remove {name} and set policy.megatron_cfg.attention_backend instead.",
                )
            )
    return out


@rule(Code.BACKEND_WITHOUT_MEGATRON)
def _without_megatron(facts: PolicyFacts) -> list[Finding]:
    if facts.megatron_enabled or facts.backend_raw is UNSET or facts.backend_raw is None:
        return []
    return [
        finding(
            Code.BACKEND_WITHOUT_MEGATRON,
            BACKEND_KEY,
            facts.backend_raw,
            "policy.megatron_cfg.enabled is not truthy, so NeMo-RL does not use Megatron or this key.",
            "set policy.megatron_cfg.enabled=true, or remove attention_backend.",
        )
    ]


def evaluate(facts: PolicyFacts) -> list[Finding]:
    """Run every rule on ``facts``; findings in rule order."""
    return [f for check, _ in RULES for f in check(facts)]
