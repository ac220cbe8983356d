"""The training / rollout kernel pairs the hosts themselves document as computing attention differently.

Each ``DocumentedPair`` is one statement a host makes in its own sources or tracker, where it says
it, and the host's own fix. ``pair_findings`` matches them against a ``KernelPlan`` (the kernels
``check --gpu`` predicts from TE's and vLLM's selectors) and returns one ``KERNEL_PAIR_DOCUMENTED``
warning per match. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nemo_rl_attn_align.kernels.kernel_query import Kernel, KernelPlan, RolloutQuery
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding

#: The GPUs on which vLLM's FLASHINFER backend runs FlashInfer's TRT-LLM kernels (the sm100 family).
TRTLLM_GPUS = ("sm100", "sm103")


@dataclass(frozen=True)
class DocumentedPair:
    """A kernel pair a host documents as mismatching: when it applies, what the host says, where, its fix."""

    applies: Callable[[str, Kernel, Kernel, RolloutQuery | None], bool]  # (gpu, training, rollout, rollout query)
    says: str
    source: str
    key: str
    value: str
    #: What the recipe sets ``key`` to, from the rollout query (None: unset, or not in the query).
    current: Callable[[RolloutQuery | None], object] = lambda query: None


def _trains_with_te(training: Kernel) -> bool:
    return training.kernel in ("FlashAttention", "FusedAttention", "UnfusedDotProductAttention")


def flash_generation(kernel: Kernel) -> int | None:
    """The flash-attn generation a kernel runs: TE's FlashAttention by its flash-attn version, vLLM's
    FLASH_ATTN and Megatron generation's flash_attn by ``FA<n>`` (None: not flash-attn, or not known)."""
    version = kernel.version or ""
    if kernel.kernel == "FlashAttention":
        major = version.split(".")[0]
    elif kernel.kernel in ("FLASH_ATTN", "flash_attn") and version.startswith("FA"):
        major = version[2:]
    else:
        return None
    return int(major) if major.isdigit() else None


def one_generation(plan: KernelPlan) -> bool:
    """Whether the main training kernel and every rollout kernel run the same flash-attn generation."""
    main = plan.main("training")
    generation = flash_generation(main.kernel) if main is not None else None
    return (
        generation is not None
        and bool(plan.rollout)
        and all(flash_generation(kind.kernel) == generation for kind in plan.rollout)
    )


def _other_flash_generation(training: Kernel, rollout: Kernel) -> bool:
    """Megatron generation's flash-attn against a training kernel that is not the same flash-attn generation."""
    if rollout.kernel != "flash_attn" or not _trains_with_te(training):
        return False
    return flash_generation(training) != flash_generation(rollout)


DOCUMENTED_PAIRS = (
    DocumentedPair(
        lambda gpu, training, rollout, _: (
            gpu in TRTLLM_GPUS and rollout.kernel == "FLASHINFER" and _trains_with_te(training)
        ),
        "FLASHINFER (vLLM's default on Blackwell) runs TRT-LLM attention, which computes attention inconsistently "
        "with Megatron/TE and causes a logprobs mismatch",
        "NeMo-RL examples/configs/recipes/llm/grpo-gptoss-20b-8n4g-megatron.yaml",
        "policy.generation.vllm_kwargs.attention_backend",
        "TRITON_ATTN",
        lambda query: query.forced_backend if query is not None else None,
    ),
    DocumentedPair(
        lambda gpu, _, rollout, query: (
            rollout.kernel == "FLASH_ATTN" and rollout.version == "FA3" and query is not None and query.batch_invariant
        ),
        "VLLM_BATCH_INVARIANT=1 does not make FlashAttention 3 batch invariant on Hopper: its tile scheduler "
        "specializes on the batch's max_seqlen_q, so a sequence's logprobs change with its neighbours",
        "vLLM issues #47069 and #51902; PR #48694 (fall back to FA2) is not in the vLLM the tables hold",
        "policy.generation.vllm_kwargs.attention_config.flash_attn_version",
        "2",
        lambda query: query.flash_attn_version if query is not None else None,
    ),
    DocumentedPair(
        lambda gpu, training, rollout, _: _other_flash_generation(training, rollout),
        "megatron-core's inference calls flash-attn itself and resolves its generation on its own (4 > 3 > 2 as "
        "installed); it states that the training (Transformer Engine) and inference attention paths must run the "
        "same FlashAttention kernel, so the version cannot be left to each path's autodetection",
        "megatron-core 0.19.2 transformer_config.py (batch_invariant_mode) and Attention._resolve_flash_version",
        "policy.megatron_cfg.model_overrides.flash_attention_version",
        "the flash-attn generation training runs, with policy.megatron_cfg.attention_backend=flash",
    ),
)


def pair_findings(plan: KernelPlan) -> list[Finding]:
    """A warning for each documented mismatching pair among ``plan``'s kernels (the main training layer
    kind against each rollout layer kind; one warning per pair, naming every rollout kind it holds for)."""
    main = plan.main("training")
    if plan.gpu is None or main is None or not main.kernel.known:
        return []
    out = []
    for pair in DOCUMENTED_PAIRS:
        kinds = [
            kind
            for kind in plan.rollout
            if kind.kernel.known
            and pair.applies(
                plan.gpu, main.kernel, kind.kernel, kind.query if isinstance(kind.query, RolloutQuery) else None
            )
        ]
        if kinds:
            rollout = " and ".join(dict.fromkeys(kind.kernel.label for kind in kinds))
            layers = "; ".join(kind.layers for kind in kinds)
            query = kinds[0].query if isinstance(kinds[0].query, RolloutQuery) else None
            out.append(
                finding(
                    Code.KERNEL_PAIR_DOCUMENTED,
                    pair.key,
                    pair.current(query),
                    f"on {plan.gpu} training runs {main.kernel.label} and the rollout {rollout} ({layers}): "
                    f"{pair.says} [{pair.source}].",
                    f"set {pair.key}={pair.value}.",
                )
            )
    return out
