"""Every stable finding code of the plugin, in one registry.

One member per code, written once: its value (the code as reports, logs and users' greps see it;
never changed once released), its kind (which part of the plugin raises it), its severity and a
one-line summary. The rule table of docs/rules-and-limits.md and ``docs/report-schema.md``'s code table are generated
from here (``scripts/update_code_tables.py``; the tests fail when a table differs).

Adding a code: one member here; a rule code also needs its rule in ``preflight/rules/``
(``@rule(Code.X)``). A member's name is its value, so ``Code.X`` in the source reads as the
``X`` users see. Stdlib only; imports nothing of the package (``errors`` builds findings on it).
"""

from __future__ import annotations

import enum


class Severity(str, enum.Enum):
    """How much a finding matters: ``error`` stops the run, ``warning`` is shown, ``info`` is recorded."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Kind(str, enum.Enum):
    """Which part of the plugin raises a code."""

    RULE = "rule"  # preflight rules: settings that cannot work, before any GPU work
    BINDING = "binding"  # binding a training contract to a rollout contract
    DETERMINISM = "determinism"  # comparing the determinism variables of the two sides
    REPORT = "report"  # collecting the workers' records into the run report
    PRESET = "preset"  # ``attention_align.preset: aligned``
    KERNEL = "kernel"  # the kernel each side's own selector picks on a GPU (``check --gpu``)
    HOST = "host"  # a worker's hook, of what its host did in the run (e.g. the first packed micro-batch)


ERROR, WARNING, INFO = Severity
RULE, BINDING, DETERMINISM, REPORT, PRESET, KERNEL, HOST = Kind


class Code(str, enum.Enum):
    """A stable code: ``value`` is the code, ``kind``, ``severity`` and ``summary`` describe it.

    Each member is ``(value, kind, severity, summary)``; the severity is a ``Severity``, or the words
    that say when it varies (``severity`` is then None and ``severity_text`` gives the words)."""

    # --- preflight rules (docs/rules-and-limits.md) ----------------------------------------------------
    CONFIG_VALUE_INVALID = (
        "CONFIG_VALUE_INVALID",
        RULE,
        ERROR,
        "a key the rules read has a value NeMo-RL or Megatron rejects (wrong type, out of range, broken structure).",
    )
    MEGATRON_KEY_MISSING = (
        "MEGATRON_KEY_MISSING",
        RULE,
        ERROR,
        "megatron_cfg lacks tensor_model_parallel_size, pipeline_model_parallel_size or context_parallel_size; "
        "NeMo-RL indexes them without a default and the run dies with a KeyError.",
    )
    FLAG_NOT_BOOLEAN = (
        "FLAG_NOT_BOOLEAN",
        RULE,
        WARNING,
        "a Megatron flag is not true/false; Megatron reads it by truthiness (1, 'false', 'no' are on).",
    )
    NUMBER_IS_BOOLEAN = (
        "NUMBER_IS_BOOLEAN",
        RULE,
        WARNING,
        "a count or size is true/false (YAML reads true, yes, on as true); the host takes it as the number 1 or 0.",
    )
    ATTN_BACKEND_INVALID = (
        "ATTN_BACKEND_INVALID",
        RULE,
        ERROR,
        "attention_backend is not one of flash, fused, unfused, local, auto (exact, lower case).",
    )
    ATTN_BACKEND_NULL = (
        "ATTN_BACKEND_NULL",
        RULE,
        WARNING,
        "attention_backend: null; NeMo-RL treats it as unset, so Megatron's default (auto) applies.",
    )
    PRECISION_INVALID = (
        "PRECISION_INVALID",
        RULE,
        ERROR,
        "policy.precision or megatron_cfg.pipeline_dtype is not float32, bfloat16 or float16.",
    )
    FLASH_REQUIRES_HALF_PRECISION = (
        "FLASH_REQUIRES_HALF_PRECISION",
        RULE,
        ERROR,
        "flash with policy.precision float32: TE's FlashAttention runs only fp16/bf16 and fails at the first forward.",
    )
    FUSED_REQUIRES_HALF_PRECISION = (
        "FUSED_REQUIRES_HALF_PRECISION",
        RULE,
        ERROR,
        "fused with policy.precision float32: TE's FusedAttention (cuDNN) runs only fp16/bf16/fp8.",
    )
    PRECISION_OVERRIDE_IGNORED = (
        "PRECISION_OVERRIDE_IGNORED",
        RULE,
        WARNING,
        "model_overrides sets params_dtype/bf16/fp16, which NeMo-RL overwrites from policy.precision.",
    )
    LOCAL_REQUIRES_LOCAL_SPEC = (
        "LOCAL_REQUIRES_LOCAL_SPEC",
        RULE,
        ERROR,
        "local needs megatron_cfg.transformer_impl: local; with the TE layer spec TE is left no backend.",
    )
    LOCAL_NO_CONTEXT_PARALLEL = (
        "LOCAL_NO_CONTEXT_PARALLEL",
        RULE,
        ERROR,
        "transformer_impl local with "
        "context_parallel_size > 1: Megatron's own DotProductAttention asserts CP is "
        "TE-only.",
    )
    BACKEND_IGNORED_BY_LOCAL_SPEC = (
        "BACKEND_IGNORED_BY_LOCAL_SPEC",
        RULE,
        WARNING,
        "flash/fused/unfused/auto with "
        "transformer_impl local: Megatron's own attention runs, TE's backends are not "
        "used.",
    )
    UNFUSED_NO_CONTEXT_PARALLEL = (
        "UNFUSED_NO_CONTEXT_PARALLEL",
        RULE,
        ERROR,
        "unfused with context_parallel_size > 1: TE disables UnfusedDotProductAttention under CP.",
    )
    FP32_CONTEXT_PARALLEL_NO_BACKEND = (
        "FP32_CONTEXT_PARALLEL_NO_BACKEND",
        RULE,
        ERROR,
        "float32 with context_parallel_size > 1 on TE: only Unfused runs FP32 and it has no CP.",
    )
    FLASH_UNSUPPORTED_SOFTMAX = (
        "FLASH_UNSUPPORTED_SOFTMAX",
        RULE,
        ERROR,
        "flash with a non-vanilla softmax (gpt-oss learnable sinks): TE disables FlashAttention (NeMo-RL #1685).",
    )
    BATCH_INVARIANT_REQUIRES_FLASH = (
        "BATCH_INVARIANT_REQUIRES_FLASH",
        RULE,
        ERROR,
        "batch_invariant_mode with a backend other than flash: TransformerConfig asserts flash.",
    )
    BATCH_INVARIANT_REQUIRES_BF16 = (
        "BATCH_INVARIANT_REQUIRES_BF16",
        RULE,
        ERROR,
        "batch_invariant_mode needs policy.precision bfloat16.",
    )
    BATCH_INVARIANT_NO_CONTEXT_PARALLEL = (
        "BATCH_INVARIANT_NO_CONTEXT_PARALLEL",
        RULE,
        ERROR,
        "batch_invariant_mode needs context_parallel_size 1.",
    )
    BATCH_INVARIANT_REQUIRES_FLASH_VERSION = (
        "BATCH_INVARIANT_REQUIRES_FLASH_VERSION",
        RULE,
        ERROR,
        "batch_invariant_mode needs model_overrides.flash_attention_version 3 or 4 (megatron-core >= 0.19 asserts it).",
    )
    BATCH_INVARIANT_NO_ATTENTION_DROPOUT = (
        "BATCH_INVARIANT_NO_ATTENTION_DROPOUT",
        RULE,
        ERROR,
        "batch_invariant_mode needs attention_dropout 0 (megatron-core >= 0.19 asserts it).",
    )
    GENERATION_ATTENTION_DIFFERS = (
        "GENERATION_ATTENTION_DIFFERS",
        RULE,
        WARNING,
        "Megatron generation's model runs attention settings other than training's (mcore_generation_config).",
    )
    MODEL_OVERRIDE_CONFLICT = (
        "MODEL_OVERRIDE_CONFLICT",
        RULE,
        ERROR,
        "model_overrides repeats a first-class attention key; NeMo-RL rejects it at worker start.",
    )
    NVTE_ENV_CONFLICT = (
        "NVTE_ENV_CONFLICT",
        RULE,
        ERROR,
        "NVTE_* in the environment or megatron_cfg.env_vars "
        "disagrees with what Megatron sets; its assert fails at model build.",
    )
    NVTE_ENV_DISCARDED = (
        "NVTE_ENV_DISCARDED",
        RULE,
        WARNING,
        "NVTE_* set while attention_backend is set: NeMo-RL removes it before the model is built, so it has no effect.",
    )
    BACKEND_WITHOUT_MEGATRON = (
        "BACKEND_WITHOUT_MEGATRON",
        RULE,
        WARNING,
        "attention_backend set while megatron_cfg.enabled is not truthy: it has no effect.",
    )
    VLLM_KWARG_PASSED_TWICE = (
        "VLLM_KWARG_PASSED_TWICE",
        RULE,
        ERROR,
        "a policy.generation.vllm_kwargs key NeMo-RL's vLLM worker passes to vLLM itself; "
        "the worker raises TypeError at start, after the cluster is up.",
    )

    # --- kernels on a GPU (check --gpu; docs/rules-and-limits.md) ---------------------------------------
    TE_NO_BACKEND = (
        "TE_NO_BACKEND",
        KERNEL,
        ERROR,
        "on the GPU, Transformer Engine's own selector finds no attention backend for this model and backend.",
    )
    VLLM_NO_BACKEND = (
        "VLLM_NO_BACKEND",
        KERNEL,
        ERROR,
        "on the GPU, vLLM's own CUDA selector finds no attention backend; the engine fails to start.",
    )
    KERNEL_PAIR_DOCUMENTED = ("KERNEL_PAIR_DOCUMENTED", KERNEL, WARNING, "a kernel pair a host calls mismatching")
    KERNEL_PAIR_SPLIT = ("KERNEL_PAIR_SPLIT", KERNEL, WARNING, "no setting gives both sides one flash-attn kernel")

    # --- binding (docs/report-schema.md "Codes") ---------------------------------------------
    ATTN_IDENTITY_MISMATCH = ("ATTN_IDENTITY_MISMATCH", BINDING, ERROR, "an identity field differs between the sides")
    ATTN_BEHAVIOUR_MISMATCH = (
        "ATTN_BEHAVIOUR_MISMATCH",
        BINDING,
        ERROR,
        "the two sides' live modules compute a different RoPE, mask or softmax (a behaviour field differs)",
    )
    ATTN_EXPLAINED_DIFFERENCE = (
        "ATTN_EXPLAINED_DIFFERENCE",
        BINDING,
        INFO,
        "a configuration field differs while the behaviour field it describes was measured on both sides "
        "(listed as the explanation)",
    )
    ATTN_SEMANTIC_SIDES_DIFFER = (
        "ATTN_SEMANTIC_SIDES_DIFFER",
        BINDING,
        ERROR,
        "a semantic field differs between the sides",
    )
    ATTN_SEMANTIC_MANDATE = (
        "ATTN_SEMANTIC_MANDATE",
        BINDING,
        ERROR,
        "a side's semantic field differs from the mandate",
    )
    ATTN_DTYPE_DIFFERENCE_ALLOWED = (
        "ATTN_DTYPE_DIFFERENCE_ALLOWED",
        BINDING,
        INFO,
        "dtype differs, allowed by `allow_dtype_difference`",
    )
    ATTN_RECORDED_DIFFERENCE = (
        "ATTN_RECORDED_DIFFERENCE",
        BINDING,
        INFO,
        "a recorded field differs (listed, never rejected)",
    )
    ATTN_UNOBSERVABLE = (
        "ATTN_UNOBSERVABLE",
        BINDING,
        WARNING,
        "a field has no runtime readback on a side: not comparable",
    )
    ATTN_PENDING = (
        "ATTN_PENDING",
        BINDING,
        WARNING,
        "a field is known only once the engines run (previews): not comparable",
    )

    # --- determinism -------------------------------------------------------------------------
    DET_BLOCKING_MISMATCH = (
        "DET_BLOCKING_MISMATCH",
        DETERMINISM,
        ERROR,
        "NCCL_ALGO, NCCL_PROTO or CUBLAS_WORKSPACE_CONFIG means different things on the two sides",
    )
    DET_RECORDED_DIFFERENCE = (
        "DET_RECORDED_DIFFERENCE",
        DETERMINISM,
        INFO,
        "another determinism variable or torch flag differs",
    )
    DET_EQUIVALENT = (
        "DET_EQUIVALENT",
        DETERMINISM,
        INFO,
        "different values with the same meaning (e.g. `:4096:8` and `:16:8`, unset and the default)",
    )
    DET_NOT_PROBED = ("DET_NOT_PROBED", DETERMINISM, INFO, "a side's torch flags were not read")

    # --- report ------------------------------------------------------------------------------
    REPORT_WORKER_DIVERGES = (
        "REPORT_WORKER_DIVERGES",
        REPORT,
        ERROR,
        "a worker disagrees with the first worker of its side",
    )
    REPORT_WORKER_MISSING = ("REPORT_WORKER_MISSING", REPORT, WARNING, "an expected worker wrote no record")
    REPORT_RECORD_UNREADABLE = (
        "REPORT_RECORD_UNREADABLE",
        REPORT,
        WARNING,
        "a worker record or host detail could not be read",
    )
    REPORT_SIDE_MISSING = (
        "REPORT_SIDE_MISSING",
        REPORT,
        "warning (error with `attention_align.strict: true` when the config says how many workers the side starts)",
        "no worker of a side wrote a record",
    )
    REPORT_ROLLOUT_NOT_BOUND = (
        "REPORT_ROLLOUT_NOT_BOUND",
        REPORT,
        "warning (error with `attention_align.strict: true`)",
        "the run's generation workers record nothing (SGLang, Dynamo, TRT-LLM): the rollout side is not bound",
    )
    REPORT_SIDE_ABSENT = (
        "REPORT_SIDE_ABSENT",
        REPORT,
        INFO,
        "the run has no such side by design (e.g. SFT: no rollout side); the binding is not applicable",
    )
    REPORT_WORKER_FINDING = (
        "REPORT_WORKER_FINDING",
        REPORT,
        WARNING,
        "a worker's hook found a difference between request "
        "and reality (e.g. the attention backend Transformer Engine ran)",
    )

    # --- host: a worker's hook, of what its host did in the run ---------------------------------
    PACKED_BOUNDARIES_DROPPED = (
        "PACKED_BOUNDARIES_DROPPED",
        HOST,
        ERROR,
        "a packed batch was attended as one sequence: an attention call of the first packed micro-batch "
        "received fewer sequence boundaries (`cu_seqlens`) than the training worker packed sequences",
    )

    # --- preset ------------------------------------------------------------------------------
    ALIGN_PRESET_REFUSED = (
        "ALIGN_PRESET_REFUSED",
        PRESET,
        ERROR,
        "`attention_align.preset: aligned` left a mismatch: "
        "removing it takes a change the preset never makes (parallel layout, rollout precision) or "
        "no setting removes it; the finding says which",
    )

    _kind: Kind
    _severity: Severity | str
    _summary: str

    def __new__(cls, value: str, kind: Kind, severity: Severity | str, summary: str) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member._kind = kind
        member._severity = severity
        member._summary = summary
        return member

    @property
    def kind(self) -> Kind:
        """Which part of the plugin raises this code."""
        return self._kind

    @property
    def varies(self) -> bool:
        """Whether the severity depends on the case (``severity_text`` says how)."""
        return not isinstance(self._severity, Severity)

    @property
    def severity(self) -> Severity:
        """The severity every finding of this code has; ValueError for a code whose severity varies
        (its caller decides the severity and passes it to ``errors.finding``)."""
        if isinstance(self._severity, Severity):
            return self._severity
        raise ValueError(f"{self.value}: the severity varies ({self._severity}); pass it explicitly")

    @property
    def severity_text(self) -> str:
        """The severity as the docs write it: ``error``, ``warning``, ``info``, or when it varies."""
        return self._severity.value if isinstance(self._severity, Severity) else self._severity

    @property
    def summary(self) -> str:
        """One line: what the code means."""
        return self._summary


def code_of(value: str) -> Code:
    """The code whose value is ``value`` (as a report holds it); ValueError for one this version
    does not know."""
    for code in Code:
        if code.value == value:
            return code
    raise ValueError(f"unknown finding code {str(value)[:80]!r}")


def codes_of(*kinds: Kind) -> list[Code]:
    """The codes of ``kinds``, in registry order."""
    return [code for code in Code if code.kind in kinds]


def markdown_table(*kinds: Kind, header: str = "meaning") -> str:
    """The markdown table (code, severity, ``header``) of the codes of ``kinds``, one row per code."""
    rows = [f"| code | severity | {header} |", "|---|---|---|"]
    rows += [f"| `{code.value}` | {code.severity_text} | {code.summary} |" for code in codes_of(*kinds)]
    return "\n".join(rows) + "\n"
