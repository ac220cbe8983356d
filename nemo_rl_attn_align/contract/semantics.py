"""What the attention computes, from what each engine runs: the one rule for ``check``'s preview and
for the workers' recorded contracts (core, stdlib only).

``te_semantics`` covers Megatron + Transformer Engine training, ``vllm_semantics`` vLLM rollout. Each
sets, on a ``ContractBuilder``, the semantic tier and the recorded fields that follow from the same
facts (``reduction_engine``, ``split_kv_policy``; for training also the KV-cache fields). A field a
rule cannot know is ``pending`` in a preview (``preview=True``) and ``unobservable`` in a worker's
record, with the reason.

Facts behind the rules (what the kernels do) are written in the ``source`` of each field.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from nemo_rl_attn_align.contract.contract import ContractBuilder
from nemo_rl_attn_align.preflight.backend import CP_COMM_TYPES
from nemo_rl_attn_align.vocab.schema import Tier, fields_of

#: vLLM backends that fold (out, lse) tiles with an online softmax and accumulate in fp32.
VLLM_ONLINE_SOFTMAX_BACKENDS = (
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "FLASH_ATTN_MLA",
    "FLASHMLA",
    "TRITON_MLA",
    "CUTLASS_MLA",
)

#: The fields ``vllm_semantics`` sets (the rollout's ``dtype`` is the caller's: it is read, not derived).
VLLM_DERIVED = ("merge_rule", "reduction_order", "acc_dtype", "downcast", "reduction_engine", "split_kv_policy")


def te_semantics(
    b: ContractBuilder, backend: str | None, dtype: str | None, cp: int, comm: Any, *, preview: bool
) -> None:
    """Megatron + TE training: the semantic tier, ``reduction_engine``, ``split_kv_policy`` and the
    KV-cache fields, for an ``AttnBackend`` name, a dtype (``fp32``, ``bf16``, ...), the
    context-parallel size and ``cp_comm_type``. ``None`` backend or dtype: the derived fields are
    not known. The preview calls it with the configured backend, the Megatron worker with the one
    Transformer Engine was seen to run."""
    b.configured("split_kv_policy", "none", "TE's training forward does not split the KV")
    for name in ("kv_page_size", "kv_cache_dtype", "chunked_prefill_chunk", "prefix_caching"):
        b.configured(name, None, "full-sequence forward: no KV cache")
    if backend is None or dtype is None:
        what = "the attention backend" if backend is None else "the dtype"
        where = "see the pre-flight findings" if preview else "not readable from the model config"
        why = f"{what} is not known ({where})"
        for name in (*fields_of(Tier.SEMANTIC), "reduction_engine"):
            b.unknown(name, why, preview)
        return
    b.configured("dtype", dtype, "policy.precision")
    b.configured("acc_dtype", "fp32", "TE flash/fused kernels and cuBLAS (unfused) accumulate in fp32")
    if backend in ("unfused", "local") or (backend == "auto" and dtype == "fp32"):
        _te_full_softmax(b, backend)
        return
    b.configured(
        "merge_rule",
        "online_softmax_lse",
        f"attention_backend {backend}: TE FlashAttention/FusedAttention fold KV tiles with an online softmax",
    )
    _te_kv_reduction(b, preview, dtype, cp, comm)


def _te_full_softmax(b: ContractBuilder, backend: str) -> None:
    """TE's unfused attention (or Megatron's local one): one softmax over the whole score row."""
    why = (
        "auto with float32: TE's only fp32 backend is UnfusedDotProductAttention"
        if backend == "auto"
        else f"attention_backend {backend}: one softmax over the materialized score row"
    )
    b.configured("merge_rule", "full_softmax", why)
    b.configured("reduction_order", "unspecified", why + "; the softmax row reduction has no KV block order")
    b.configured("downcast", "final_write", why + "; the output is written once")
    b.configured(
        "reduction_engine",
        "single_kernel",
        why + "; no partials to merge (TE and Megatron run it only without context parallelism)",
    )


def _te_kv_reduction(b: ContractBuilder, preview: bool, dtype: str, cp: int, comm: Any) -> None:
    """How TE's flash/fused attention folds the KV: one kernel pass, or context parallelism's
    ring-step partials or gathered KV, by ``cp_comm_type``."""
    if cp == 1:
        why = "one kernel pass over the KV in tile order"
        b.configured("reduction_order", "kv_index", why)
        b.configured("downcast", "final_write", why + "; fp32 accumulators written once")
        b.configured("reduction_engine", "single_kernel", "context_parallel_size 1: no partials to merge")
        return
    if comm not in CP_COMM_TYPES:
        for name in ("reduction_order", "downcast", "reduction_engine"):
            b.unknown(name, f"cp_comm_type {comm!r} is not one of {', '.join(CP_COMM_TYPES)}", preview)
        return
    b.configured(
        "reduction_engine",
        f"te_cp_{comm}",
        f"context_parallel_size {cp}, cp_comm_type {comm}: TE's context-parallel attention",
    )
    if comm in ("p2p", "a2a+p2p"):  # the ring types: TE merges per-step (out, lse) partials
        b.configured(
            "reduction_order",
            "ring_step",
            f"context_parallel_size {cp}, cp_comm_type {comm}: TE merges per-step (out, lse) partials in ring-step "
            f"order, which depends on rank and cp_size",
        )
        b.configured(
            "downcast",
            "per_partial",
            f"cp_comm_type {comm}: each ring step's kernel writes its partial output in {dtype} before the LSE "
            f"correction",
        )
    else:
        why = f"cp_comm_type {comm}: the full KV is gathered, one kernel pass"
        b.configured("reduction_order", "kv_index", why)
        b.configured("downcast", "final_write", why + "; fp32 accumulators written once")


def vllm_semantics(b: ContractBuilder, backends: Collection[str] | None, invariant: bool, *, preview: bool) -> None:
    """vLLM rollout: ``VLLM_DERIVED`` for the backends the attention layers run and batch-invariant
    mode (``VLLM_BATCH_INVARIANT``).

    ``backends`` is what the layers run (a worker; empty: none could be read), or None when vLLM
    has not chosen yet (a preview: vLLM's choice is assumed; in batch-invariant mode that is
    FLASH_ATTN, the one vLLM runs there unless another is requested)."""
    chosen = None if backends is None else frozenset(backends)
    if chosen is not None and not (chosen and chosen <= set(VLLM_ONLINE_SOFTMAX_BACKENDS)):
        why = (
            f"backend {', '.join(sorted(chosen))}: its reduction is not known to this plugin"
            if chosen
            else "no attention layer names its backend"
        )
        for name in VLLM_DERIVED:
            b.unknown(name, why, preview)
        return
    names = ", ".join(sorted(chosen)) if chosen else "vLLM's paged attention backends"
    b.configured("merge_rule", "online_softmax_lse", f"{names}: (out, lse) partials merged with an online softmax")
    b.configured("acc_dtype", "fp32", f"{names}: fp32 accumulators")
    b.configured("downcast", "final_write", "split-KV partials stay fp32 until the output is written once")
    if invariant:
        if chosen is None or chosen == {"FLASH_ATTN"}:
            why = "VLLM_BATCH_INVARIANT=1: FLASH_ATTN passes num_splits=1" + (
                "" if chosen else " (FLASH_ATTN assumed: vLLM's batch-invariant backend)"
            )
            b.configured("split_kv_policy", "fixed_count:1", why)
            b.configured("reduction_order", "kv_index", why + ": one KV split, tiles folded in KV order")
            b.configured("reduction_engine", "single_kernel", why + ": no split-KV combine")
        else:
            why = f"VLLM_BATCH_INVARIANT=1 with {names}: its split-KV policy is not known to this plugin"
            for name in ("split_kv_policy", "reduction_order", "reduction_engine"):
                b.unknown(name, why, preview)
        return
    b.configured(
        "split_kv_policy",
        "heuristic",
        "vLLM fixes no split count (FLASH_ATTN passes num_splits=0): the kernel picks it per launch",
    )
    b.configured(
        "reduction_order",
        "split_kv",
        "decode may split the KV (FlashAttention num_splits heuristic, FlashInfer/Triton split-KV decode); the order "
        "depends on the batch",
    )
    if chosen == {"FLASH_ATTN"}:
        b.configured(
            "reduction_engine",
            "fa_split_combine",
            "FLASH_ATTN: flash-attn's split-KV combine kernel merges the partials",
        )
    else:
        b.unknown(
            "reduction_engine",
            f"{names}: the split-KV merge kernel depends on the backend"
            + (" vLLM picks at engine start" if chosen is None else ""),
            preview,
        )


def megatron_inference_semantics(
    b: ContractBuilder, flash_version: int | None, invariant: bool | None, *, preview: bool
) -> None:
    """Megatron generation (megatron-core's dynamic inference engine): the merge rule, reduction order
    and engine, accumulation, downcast and split-KV policy (the dtype is the caller's: the model's
    params dtype) for the flash-attn generation its attention layers call (2, 3 or 4; None: not
    known) and ``batch_invariant_mode``.

    With a dynamic inference context every layer calls flash-attn itself
    (``Attention.flash_decode_and_prefill``, megatron-core 0.19), not Transformer Engine: the
    ``*_with_kvcache`` decode and the varlen prefill kernels over the paged cache, with
    ``num_splits=0`` (the kernel's split-KV heuristic) or 1 in batch-invariant mode; and no context
    parallelism."""
    b.configured("cp_size", 1, "NeMo-RL pins the inference context parallelism to 1")
    b.configured("cp_layout", "none", "no context parallelism")
    b.configured("cp_comm_type", None, "no context parallelism")
    b.configured("decode_cp_size", None, "megatron-core's inference has no decode context parallelism")
    kernel = f"flash-attn {flash_version}" if flash_version else "flash-attn"
    b.configured("merge_rule", "online_softmax_lse", f"{kernel}: KV tiles folded with an online softmax")
    b.configured("acc_dtype", "fp32", f"{kernel}: fp32 accumulators")
    b.configured("downcast", "final_write", "split-KV partials stay fp32 until the output is written once")
    if invariant is None:
        for name in ("split_kv_policy", "reduction_order", "reduction_engine"):
            b.unknown(name, "batch_invariant_mode is not known: it decides num_splits", preview)
        return
    if invariant:
        why = "batch_invariant_mode: megatron-core passes num_splits=1 (flash-attn 3/4 only)"
        b.configured("split_kv_policy", "fixed_count:1", why)
        b.configured("reduction_order", "kv_index", why + ": one KV split, tiles folded in KV order")
        b.configured("reduction_engine", "single_kernel", why + ": no split-KV combine")
        return
    b.configured(
        "split_kv_policy", "heuristic", "megatron-core passes num_splits=0: flash-attn picks the split count per launch"
    )
    b.configured(
        "reduction_order",
        "split_kv",
        "decode may split the KV (flash-attn's num_splits heuristic): the order depends on the batch",
    )
    b.configured("reduction_engine", "fa_split_combine", f"{kernel}'s split-KV combine kernel merges the partials")
