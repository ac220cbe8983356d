"""Which attention kernel each side will run on a GPU generation, decided by the hosts' own selectors.

``plan_kernels`` reads the recipe's facts and, for each kind of attention layer the model has on
each side (``RecipeFacts.model``: the hosts' own readings of its config.json), a ``TrainingQuery``
(TE's ``get_attention_backend``) and a ``RolloutQuery`` (vLLM's CUDA selector), and answers each:

* with the real selector in this process, when ``live`` (the GPU asked about is this machine's)
  and the host library loads here (``hosts.te_selector``, ``hosts.vllm_selector``);
* else from the tables generated from those selectors (``kernel_table``), labelled with the
  versions they came from.

``kernel_findings`` turns a layer kind that has no kernel into an error (``TE_NO_BACKEND``,
``VLLM_NO_BACKEND``) with the selector's own reasons and, from the same source, the backends
that would run instead. megatron-core's DSA layers run its own sparse attention (TE selects
nothing). Nothing here imports torch unless ``live`` reaches a selector.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nemo_rl_attn_align.codes import Code
from nemo_rl_attn_align.errors import Finding, finding
from nemo_rl_attn_align.preflight import kernel_table
from nemo_rl_attn_align.preflight.architectures import NotRead
from nemo_rl_attn_align.preflight.facts import is_count
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.preflight.kernel_query import (
    DTYPE_OF_PRECISION,
    Kernel,
    KernelPlan,
    KindKernel,
    RolloutQuery,
    TrainingQuery,
    substantive,
)
from nemo_rl_attn_align.preflight.model_attention import HostModel, LayerKind
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

#: The Transformer Engine NeMo-RL main pins (7ea279a pyproject: transformer-engine @ v2.14.1).
NEMO_RL_TE = "2.14.1"
BACKENDS = ("flash", "fused", "unfused", "auto")


#: The kernel megatron-core runs for DSA layers (its own sparse attention; TE selects nothing there).
DSA_KERNEL = "DSAttention"
DSA_SOURCE = "megatron-core's sparse attention (Transformer Engine selects nothing)"


def _tp(facts: RecipeFacts) -> int:
    policy = facts.require_policy()
    return policy.tensor_parallel_size.value if is_count(policy.tensor_parallel_size.value) else 1


def _training_side(facts: RecipeFacts) -> str | None:
    """Why TE selects nothing for this recipe's training (None: it selects per layer kind)."""
    policy = facts.policy
    if policy is None or not policy.megatron_enabled:
        return "policy.megatron_cfg.enabled is not truthy: no Megatron training side"
    if policy.transformer_impl == "local" or policy.effective_backend == "local":
        return "Megatron's own DotProductAttention runs (local); Transformer Engine selects nothing"
    if policy.effective_backend is None:
        return "policy.megatron_cfg.attention_backend is invalid"
    if DTYPE_OF_PRECISION.get(policy.precision or "") is None:
        return "policy.precision is not set to float32, bfloat16 or float16"
    return None


def training_query(facts: RecipeFacts, kind: LayerKind, gpu: str, flash_attn_3: bool) -> TrainingQuery:
    """What TE will decide one kind of training attention layer on (per tensor-parallel rank)."""
    policy = facts.require_policy()
    tp = _tp(facts)
    switches = tuple(sorted((n, v) for n, (v, _) in policy.te_env.items() if n.startswith("NVTE_FLASH_ATTN_V")))
    return TrainingQuery(
        gpu=gpu,
        backend=str(policy.effective_backend),
        dtype=DTYPE_OF_PRECISION[str(policy.precision)],
        heads=max(1, kind.heads // tp),
        kv_heads=max(1, kind.kv_heads // tp),
        head_dim_qk=kind.head_dim_qk,
        head_dim_v=kind.head_dim_v,
        window=kind.window,
        softmax=policy.softmax_type.value if "softmax_type" in policy.model_overrides else kind.softmax,
        cp_size=policy.context_parallel_size,
        qkv_format="thd" if policy.sequence_packing else "sbhd",
        deterministic=policy.te_deterministic,
        flash_attn_3=flash_attn_3,
        seq_len=policy.seq_len.value or kernel_table.TRAINING_FIXED["seq_len"],
        batch_size=policy.physical_batch.value or kernel_table.TRAINING_FIXED["batch_size"],
        flash_switches=switches,
    )


def _rollout_side(facts: RecipeFacts) -> str | None:
    """Why vLLM selects nothing for this recipe's rollout (None: it selects per layer kind)."""
    gen = facts.generation
    if not gen.is_vllm:
        return "policy.generation.backend is not vllm"
    if DTYPE_OF_PRECISION.get(str(gen.precision.value)) is None:
        return f"{gen.precision.key} is not float32, bfloat16 or float16"
    return None


def rollout_query(facts: RecipeFacts, kind: LayerKind, gpu: str, environ: Mapping[str, str]) -> RolloutQuery:
    """What vLLM's CUDA selector will decide one kind of rollout attention layer on."""
    gen = facts.generation
    forced = (
        gen.attention_backend or gen.env_vars.get("VLLM_ATTENTION_BACKEND") or environ.get("VLLM_ATTENTION_BACKEND")
    )
    mla = kind.mla is not None
    return RolloutQuery(
        gpu=gpu,
        dtype=DTYPE_OF_PRECISION[str(gen.precision.value)],
        head_size=kind.head_dim_qk,
        kv_cache_dtype=str(gen.kv_cache_dtype.value or "auto"),
        sliding_window=kind.window is not None,
        has_sink=kind.sinks,
        batch_invariant=vllm_batch_invariant({**environ, **gen.env_vars}),
        heads=kind.heads,
        forced_backend=str(forced) if forced else None,
        use_mla=mla,
        use_sparse=mla and kind.sparse,
    )


def _installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # imports tempfile: only where a table is read

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def te_table_version(requested: str | None = None) -> tuple[str | None, str]:
    """The TE version whose table answers: ``requested``, else the installed TE's, else NeMo-RL main's pin."""
    tables = kernel_table.load("training")
    if requested is not None:
        return (requested, "--te") if requested in tables else (None, f"--te {requested} has no table")
    installed = _installed("transformer-engine")
    if installed in tables:
        return installed, "the installed transformer-engine"
    if NEMO_RL_TE in tables:
        return NEMO_RL_TE, "NeMo-RL main's pin; --te chooses another"
    newest = max(tables, default=None, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    return newest, "the newest table"


def _live_allowed(module: str) -> bool:
    return importlib.util.find_spec(module.split(".")[0]) is not None


def predict_training(query: TrainingQuery, te_version: str | None = None, live: bool = False) -> Kernel:
    """TE's answer for ``query``: its selector run here when ``live`` and TE loads, else the table."""
    if live and _live_allowed("transformer_engine"):
        from nemo_rl_attn_align.hosts import te_selector

        if te_selector.unavailable() is None:
            return te_selector.select(query)
    chosen, why = te_table_version(te_version)
    table = kernel_table.load("training").get(chosen) if chosen else None
    if table is None:
        return Kernel("training", pending=f"no Transformer Engine table ({why})")
    cell, assumptions = kernel_table.training_cell(query)
    if isinstance(cell, str):
        return Kernel("training", pending=cell)
    answer = table.answer(cell, assumptions, omit=None if query.flash_attn_3 else "flash-attn-3")
    return replace(answer, source=f"{answer.source}; {chosen}: {why}")


def predict_rollout(query: RolloutQuery, live: bool = False) -> Kernel:
    """vLLM's answer for ``query``: its selector run here when ``live`` and vLLM loads, else the table."""
    if live and _live_allowed("vllm"):
        from nemo_rl_attn_align.hosts import vllm_selector

        if vllm_selector.unavailable() is None:
            return vllm_selector.select(query)
    tables = kernel_table.load("rollout")
    if not tables:
        return Kernel("rollout", pending="no vLLM table")
    cell, assumptions = kernel_table.rollout_cell(query)
    if isinstance(cell, str):
        return Kernel("rollout", pending=cell)
    newest = max(tables, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    return tables[newest].answer(cell, assumptions)


def _kind_kernel(model: HostModel, kind: LayerKind, query: Any, answer: Kernel) -> KindKernel:
    return KindKernel(kind.describe(model.num_layers), answer, query, len(kind.layers))


def _side_kernels(
    side: str, facts: RecipeFacts, gpu: str, environ: Mapping[str, str], options: dict[str, Any]
) -> tuple[tuple[KindKernel, ...], str | None]:
    """One side's kernel per layer kind, or why the side selects nothing (then no kinds)."""
    why = _training_side(facts) if side == "training" else _rollout_side(facts)
    if why is not None:
        return (), why
    model = facts.model.side(side)
    if isinstance(model, NotRead):
        pending = Kernel(side, pending=f"the model's attention is not known ({model.why})")
        return (KindKernel("the model's attention layers", pending),), None
    out = []
    for kind in model.kinds:
        if side == "training" and kind.variant == "dsa":
            own = Kernel(side, DSA_KERNEL, None, (), DSA_SOURCE)
            out.append(_kind_kernel(model, kind, None, own))
        elif side == "training":
            train = training_query(facts, kind, gpu, options["flash_attn_3"])
            out.append(_kind_kernel(model, kind, train, predict_training(train, options["te"], options["live"])))
        else:
            roll = rollout_query(facts, kind, gpu, environ)
            out.append(_kind_kernel(model, kind, roll, predict_rollout(roll, options["live"])))
    return tuple(out), None


def plan_kernels(
    facts: RecipeFacts,
    gpu: str | None,
    gpu_source: str,
    environ: Mapping[str, str],
    *,
    flash_attn_3: bool = False,
    te_version: str | None = None,
    live: bool = False,
) -> KernelPlan:
    """Both sides' kernels on ``gpu``, one per kind of attention layer (None: no GPU to predict for)."""
    if gpu is None:
        return KernelPlan(None, gpu_source, notes=(f"kernels pending: {gpu_source}",))
    options = {"flash_attn_3": flash_attn_3, "te": te_version, "live": live}
    training, no_training = _side_kernels("training", facts, gpu, environ, options)
    rollout, no_rollout = _side_kernels("rollout", facts, gpu, environ, options)
    notes = [f"no {side} kernel: {why}" for side, why in (("training", no_training), ("rollout", no_rollout)) if why]
    return KernelPlan(gpu, gpu_source, training, rollout, tuple(notes))


def _alternatives(query: TrainingQuery, te_version: str | None, live: bool) -> list[str]:
    """The other attention_backend values that give TE a kernel for the same model on the same GPU."""
    out = []
    for backend in BACKENDS:
        if backend == query.backend:
            continue
        answer = predict_training(replace(query, backend=backend), te_version, live)
        if answer.known and answer.kernel is not None:
            belief = " (by our stand-in for TE's cuDNN check)" if answer.belief else ""
            out.append(f"attention_backend={backend} runs {answer.label}{belief}")
    return out


def kernel_findings(
    plan: KernelPlan, facts: RecipeFacts, te_version: str | None = None, live: bool = False
) -> list[Finding]:
    """An error for each layer kind whose selector finds no kernel on ``plan.gpu``, with its reasons
    and what would run."""
    out = []
    for kind in plan.training:
        training, query = kind.kernel, kind.query
        if not (training.known and training.kernel is None and isinstance(query, TrainingQuery)):
            continue
        alternatives = _alternatives(query, te_version, live)
        te_says = "; ".join(reason.strip() for reason in substantive(training.reasons))
        belief = " (its FusedAttention part is our stand-in for TE's C++ check, not TE)" if training.belief else ""
        out.append(
            finding(
                Code.TE_NO_BACKEND,
                "policy.megatron_cfg.attention_backend",
                query.backend,
                f"on {plan.gpu} Transformer Engine finds no attention backend for {kind.layers} and raises 'No dot "
                f"product attention backend is available' at the first forward; TE: {te_says}"
                f"{belief} [{training.source}].",
                "; ".join(alternatives) + f" on {plan.gpu}."
                if alternatives
                else "no attention_backend gives TE a kernel for this model there; change the precision, the model "
                "or the GPU.",
            )
        )
    for kind in plan.rollout:
        rollout = kind.kernel
        if rollout.known and rollout.kernel is None:
            out.append(
                finding(
                    Code.VLLM_NO_BACKEND,
                    "policy.generation.vllm_cfg",
                    facts.generation.backend,
                    f"on {plan.gpu} vLLM finds no attention backend for {kind.layers} and the engine does not "
                    f"start; vLLM: {'; '.join(rollout.reasons)} [{rollout.source}].",
                    "change the KV-cache dtype, the precision or vllm_kwargs.attention_backend.",
                )
            )
    return out
