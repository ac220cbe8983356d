"""Pre-flight rules on combinations: values each valid alone that cannot work together.

A backend with a precision it does not run, the local layer spec with TE's backends or context
parallelism, batch-invariant mode's asserts, NVTE_* variables Megatron would contradict. Each rule
cites the host source that fails; ``values.py`` has already refused the values no host can use.
"""

from __future__ import annotations

from nemo_rl_attn_align.preflight.backend import HALF_PRECISION_ONLY, NVTE_BY_BACKEND
from nemo_rl_attn_align.preflight.facts import SOFTMAX_TYPES, UNSET, PolicyFacts
from nemo_rl_attn_align.preflight.rules.registry import BACKEND_KEY, MEGATRON_KEY, rule, truthy
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding


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
    model = facts.softmax_type
    if softmax is None and model.value != "vanilla":
        return [
            finding(
                Code.FLASH_UNSUPPORTED_SOFTMAX,
                "policy.model_name",
                facts.model_name,
                f"the model's attention has {model.value} softmax sinks ({model.key}), for which Transformer "
                "Engine disables FlashAttention.",
                "use attention_backend=fused or auto for this model.",
            )
        ]
    return []


@rule(Code.BATCH_INVARIANT_REQUIRES_FLASH, Code.BATCH_INVARIANT_REQUIRES_BF16, Code.BATCH_INVARIANT_NO_CONTEXT_PARALLEL)
def _batch_invariant(facts: PolicyFacts) -> list[Finding]:
    # megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ asserts flash
    # (megatron-core 0.16.1), context_parallel_size == 1 (core_v0.19.0, from Megatron-LM 51e915a) and
    # bf16 parameters (Megatron-LM main since 57deb43).
    if not facts.megatron_enabled or not truthy(facts.model_overrides.get("batch_invariant_mode")):
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
