"""The policy's facts: ``PolicyFacts``, what the pre-flight rules and the training preview need.

``read_policy_facts`` reads a resolved ``policy`` section (what a Megatron policy worker receives)
and the NVTE variables the worker will see; ``recipe_facts.read_recipe_facts`` reads it with the
rest of the recipe. A value the host cannot use is kept as written where a rule reports it (the
``*_raw`` fields); elsewhere a section that is not a mapping reads as empty, as NeMo-RL's own
``.get`` chains do, so the rules, not the readers, say what is wrong. ``generation_model_config``
derives the ``megatron_cfg`` Megatron generation's model runs. A ``Fact`` keeps the dotted config
key it came from (``config_lookup``). Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.config.config_lookup import (
    UNSET,
    Fact,
    as_env_vars,
    get_or_unset,
    is_count,
    positive_int,
    section,
    value_at,
)
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_facts import ModelFacts, read_model_facts
from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, DEFAULT_BACKEND, NVTE_VARIABLES
from nemo_rl_attn_align.preflight.vllm_worker_kwargs import installed_nemo_rl
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.schema import SOFTMAX_TYPES

#: ``policy.precision`` values NeMo-RL accepts (``setup.py::validate_and_set_config`` dtype_map).
PRECISIONS = ("float32", "bfloat16", "float16")
#: ``TransformerConfig.transformer_impl`` (megatron-core 0.16: ``Literal['local', 'transformer_engine',
#: 'inference_optimized']``).
TRANSFORMER_IMPLS = ("transformer_engine", "local", "inference_optimized")

#: The ``policy.megatron_cfg`` keys NeMo-RL's ``Policy.__init__`` indexes without a default once
#: Megatron is enabled, so a recipe without one dies with a KeyError before any worker starts; each
#: with the value the fix adds (the single-GPU layout). Source: nemo_rl/models/policy/lm_policy.py,
#: lines 143-145 at 7ea279a, 115-117 at v0.7.0, 108-110 at v0.6.0, 91-93 at v0.5.0 (the same three).
MEGATRON_INDEXED_KEYS: tuple[tuple[str, int], ...] = (
    ("tensor_model_parallel_size", 1),  # tp_size = config["megatron_cfg"]["tensor_model_parallel_size"]
    ("pipeline_model_parallel_size", 1),  # pp_size = config["megatron_cfg"]["pipeline_model_parallel_size"]
    ("context_parallel_size", 1),  # cp_size = config["megatron_cfg"]["context_parallel_size"]
)
#: The layout keys ``dedicated_inference_megatron_cfg`` compares (NeMo-RL indexes them directly).
LAYOUT_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "context_parallel_size",
)
#: The counts and sizes of a ``policy`` section the facts read (dotted keys under ``policy``), each
#: with what its host does with a value that is not an integer >= 1. ``LAYOUT``: NeMo-RL lays its
#: workers out with ``np.arange(world_size).reshape(...)`` of it (``lm_policy.py``,
#: ``vllm_generation.py``), which raises TypeError on a boolean, a float or a string. ``LENIENT``: the
#: host reads true as 1 and false as 0 (Python arithmetic; vLLM's pydantic engine arguments), so a
#: boolean there is taken as a number the recipe never wrote.
LAYOUT, LENIENT = "layout", "lenient"
COUNT_KEYS: dict[str, str] = {
    "megatron_cfg.tensor_model_parallel_size": LAYOUT,
    "megatron_cfg.pipeline_model_parallel_size": LAYOUT,
    "megatron_cfg.context_parallel_size": LAYOUT,
    "megatron_cfg.expert_model_parallel_size": LENIENT,
    "megatron_cfg.expert_tensor_parallel_size": LENIENT,
    "logprob_batch_size": LENIENT,
    "train_micro_batch_size": LENIENT,
    "max_total_sequence_length": LENIENT,
    "generation.vllm_cfg.tensor_parallel_size": LAYOUT,
    "generation.vllm_cfg.pipeline_parallel_size": LAYOUT,
    "generation.vllm_cfg.max_model_len": LENIENT,
    "generation.vllm_kwargs.block_size": LENIENT,
    "generation.vllm_kwargs.max_num_batched_tokens": LENIENT,
    "generation.vllm_kwargs.max_num_seqs": LENIENT,
    "generation.vllm_kwargs.attention_config.flash_attn_version": LENIENT,
    "generation.mcore_generation_config.block_size_tokens": LENIENT,
    "generation.mcore_generation_config.max_tokens": LENIENT,
    "generation.colocated.resources.gpus_per_node": LENIENT,
    "generation.colocated.resources.num_nodes": LENIENT,
}
#: ``policy.megatron_cfg`` keys NeMo-RL's ``megatron/setup.py`` sets on the model's provider, beyond the
#: backend and ``model_overrides``, that change one device's forward (``PolicyFacts.provider_settings``).
PROVIDER_KEYS = ("apply_rope_fusion", "bias_activation_fusion", "layernorm_epsilon", "transformer_impl")
#: TE switches beyond the three Megatron sets that the worker environment may carry.
TE_SWITCHES = ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FLASH_ATTN_V2", "NVTE_FLASH_ATTN_V3", "NVTE_FLASH_ATTN_V4")


def _first_positive(section: Mapping[str, Any], prefix: str, *names: str) -> Fact:
    """The first of ``names`` in ``section`` holding a positive int, with its key; else None at the first."""
    for name in names:
        value = positive_int(section.get(name))
        if value is not None:
            return Fact(value, f"{prefix}.{name}")
    return Fact(None, f"{prefix}.{names[0]}")


@dataclass(frozen=True)
class PolicyFacts:
    """What the rules and the training preview need, read once from the policy config and the environment."""

    megatron_enabled: bool
    backend_raw: Any  # UNSET, None, or the value as written
    backend: str | None  # a valid AttnBackend name, or None when unset/null/invalid
    precision_raw: Any
    pipeline_dtype_raw: Any
    transformer_impl: str
    context_parallel_size: int
    model_name: str | None
    model_overrides: dict = field(default_factory=dict)
    #: NVTE_* variable -> (value, where it comes from) as the worker will see it.
    nvte_env: dict = field(default_factory=dict)
    #: ``tensor_model_parallel_size`` as written (1 when absent, which is a ``MEGATRON_KEY_MISSING`` error).
    tensor_parallel_size: Fact = Fact(1, "policy.megatron_cfg.tensor_model_parallel_size")
    #: ``apply_rope_fusion`` when a bool, else NeMo-RL's default true.
    apply_rope_fusion: bool = True
    #: ``logprob_batch_size``, else ``train_micro_batch_size``, when a positive int; the key it came from.
    physical_batch: Fact = Fact(None, "policy.logprob_batch_size")
    #: ``policy.megatron_cfg.env_vars`` as the worker gets them.
    env_vars: Mapping[str, str] = field(default_factory=dict)
    #: ``policy.megatron_cfg.enabled`` as written (``UNSET`` when absent).
    enabled_raw: Any = UNSET
    #: ``policy.sequence_packing.enabled`` (truthy): Megatron then gets ``thd`` packed sequences.
    sequence_packing: bool = False
    #: ``policy.max_total_sequence_length`` when a positive int.
    seq_len: Fact = Fact(None, "policy.max_total_sequence_length")
    #: ``TE_SWITCHES`` in the worker environment (env_vars over the driver's): value and source.
    te_env: dict = field(default_factory=dict)
    #: The ``MEGATRON_INDEXED_KEYS`` entries (key, value to add) absent from ``policy.megatron_cfg``
    #: (a mapping), in table order; NeMo-RL's ``Policy`` raises KeyError on the first when Megatron is on.
    missing_indexed: tuple[tuple[str, int], ...] = ()
    #: The model's attention as both hosts build it (``model_facts``), read once from its config.json.
    model: ModelFacts = field(default_factory=ModelFacts)
    #: The values as written (``UNSET`` when absent) that ``rules.values`` reports when unusable; the
    #: fields above hold what the other rules use (a default where the value is unusable, then an error).
    megatron_cfg_raw: Any = UNSET
    model_name_raw: Any = UNSET
    transformer_impl_raw: Any = UNSET
    model_overrides_raw: Any = UNSET
    env_vars_raw: Any = UNSET
    #: ``generation_model_config``: what Megatron generation's model runs (None unless it generates).
    generation_model: tuple[dict[str, Any], bool, str] | None = None
    #: The ``COUNT_KEYS`` the recipe sets where its host reads them (Megatron's when Megatron trains,
    #: vLLM's or Megatron generation's by the generation backend), as written.
    counts: tuple[Fact, ...] = ()
    #: ``policy.generation.vllm_kwargs`` where NeMo-RL generates with vLLM (its vLLM worker adds
    #: them to the engine arguments it passes itself), else empty.
    vllm_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: What NeMo-RL's ``megatron/setup.py`` sets on the model's provider from ``megatron_cfg`` as
    #: written: ``PROVIDER_KEYS`` present, ``attention_backend`` unless null, ``model_overrides`` over them.
    provider_settings: Mapping[str, Any] = field(default_factory=dict)
    #: ``policy.hf_config_overrides`` when a mapping (NeMo-RL passes them to ``AutoBridge.from_hf_pretrained``).
    hf_config_overrides: Mapping[str, Any] = field(default_factory=dict)
    #: The installed NeMo-RL's version (``vllm_worker_kwargs.installed_nemo_rl``; None where
    #: NeMo-RL is not installed, as where ``check`` runs).
    nemo_rl_version: str | None = None

    @property
    def has_megatron_cfg(self) -> bool:
        """Whether ``policy.megatron_cfg`` is a mapping."""
        return isinstance(self.megatron_cfg_raw, dict)

    @property
    def precision(self) -> str | None:
        """``policy.precision`` when valid, else None."""
        return self.precision_raw if self.precision_raw in PRECISIONS else None

    @property
    def softmax_type(self) -> Fact:
        """The softmax Megatron's attention uses: ``model_overrides.softmax_type`` when valid, else what
        Megatron-Bridge's provider gives the model (``model``: gpt-oss's learnable sinks), else vanilla
        (a model whose config.json is not read here: the key says so)."""
        key = "policy.megatron_cfg.model_overrides.softmax_type"
        written = self.model_overrides.get("softmax_type")
        if isinstance(written, str) and written in SOFTMAX_TYPES:
            return Fact(written, key)
        training = self.model.training
        if isinstance(training, NotRead) or not training.kinds:
            return Fact("vanilla", f"{key} not set; the model's own is not known here: vanilla assumed")
        softmax = next((k.softmax for k in training.kinds if k.softmax != "vanilla"), "vanilla")
        return Fact(softmax, training.source)

    @property
    def te_deterministic(self) -> bool:
        """Whether TE's DotProductAttention runs deterministically: NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 in
        the worker (Megatron's deterministic_mode refuses to start without it)."""
        value = self.te_env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", ("1", ""))[0]
        try:
            return int(value) == 0 or bool(self.model_overrides.get("deterministic_mode"))
        except ValueError:
            return bool(self.model_overrides.get("deterministic_mode"))

    @property
    def effective_backend(self) -> str | None:
        """The backend in effect: the valid request, Megatron's default when unset, None when invalid."""
        if self.backend is not None:
            return self.backend
        return DEFAULT_BACKEND if self.backend_raw is UNSET or self.backend_raw is None else None


def megatron_enabled(policy_cfg: Any) -> bool:
    """Whether NeMo-RL uses the Megatron backend for this policy, decided as NeMo-RL decides it
    (``lm_policy.py``: ``bool(config.get("megatron_cfg", {}).get("enabled", False))``): any truthy
    ``enabled`` counts (``1``, ``"yes"``, even ``"false"``); a ``megatron_cfg`` that is not a mapping
    counts as disabled (NeMo-RL fails on it itself)."""
    megatron_cfg = get_or_unset(policy_cfg, "megatron_cfg")
    return isinstance(megatron_cfg, dict) and bool(megatron_cfg.get("enabled", False))


def sequence_packing_enabled(policy_cfg: Any) -> bool:
    """Whether a policy config turns NeMo-RL's sequence packing on (a truthy ``sequence_packing.enabled``;
    Megatron then gets ``thd`` packed sequences)."""
    packing = policy_cfg.get("sequence_packing") if isinstance(policy_cfg, Mapping) else None
    return isinstance(packing, Mapping) and bool(packing.get("enabled"))


def generation_model_config(policy_cfg: Any) -> tuple[dict[str, Any], bool, str] | None:
    """The ``megatron_cfg`` Megatron generation's model runs with, whether it is a model of its own
    (else the training model generates) and how it was derived; None unless the backend is megatron."""
    generation = section(policy_cfg, "generation")
    if generation.get("backend") != "megatron":
        return None
    megatron_cfg, engine_cfg = section(policy_cfg, "megatron_cfg"), section(generation, "mcore_generation_config")
    merged = {**megatron_cfg, **engine_cfg, "activation_checkpointing": False}
    colocated = section(generation, "colocated").get("enabled") is not False
    if colocated:
        merged["context_parallel_size"] = 1
        differs = any(merged.get(k, 1) != megatron_cfg.get(k, 1) for k in LAYOUT_KEYS) or merged.get(
            "transformer_impl"
        ) != megatron_cfg.get("transformer_impl")
        if not differs:
            return dict(megatron_cfg), False, "policy.megatron_cfg (the training model)"
    return merged, True, "policy.megatron_cfg merged with policy.generation.mcore_generation_config"


def _counts(policy_cfg: Mapping[str, Any], megatron: bool) -> tuple[Fact, ...]:
    """``COUNT_KEYS`` that ``policy_cfg`` sets where the host reads them (``PolicyFacts.counts``)."""
    backend = section(policy_cfg, "generation").get("backend")
    read = {"megatron_cfg": megatron, "generation.vllm_": backend == "vllm", "generation.mcore_": backend == "megatron"}
    out = []
    for key in COUNT_KEYS:
        if all(read[prefix] for prefix in read if key.startswith(prefix)):
            *parents, leaf = key.split(".")
            node = section(policy_cfg, ".".join(parents)) if parents else policy_cfg
            if leaf in node:
                out.append(Fact(node[leaf], f"policy.{key}"))
    return tuple(out)


def _nvte_env(
    env_vars: Any, environ: Mapping[str, str], names: tuple[str, ...] = NVTE_VARIABLES
) -> dict[str, tuple[str, str]]:
    env_vars = env_vars if isinstance(env_vars, dict) else {}  # another value is a CONFIG_VALUE_INVALID finding
    found = {}
    for name in names:
        if name in env_vars and env_vars[name] is not None:
            found[name] = (str(env_vars[name]), f"policy.megatron_cfg.env_vars.{name}")
        elif name in environ:
            found[name] = (environ[name], f"environment {name}")
    return found


def policy_not_a_mapping(policy_cfg: Any) -> UsageError:
    """The error for a ``policy`` section that is not a mapping."""
    return UsageError(
        f"policy is {type(policy_cfg).__name__}, not a mapping. Fix: a NeMo-RL config needs a `policy:` section."
    )


def read_policy_facts(
    policy_cfg: Any, environ: Mapping[str, str] | None = None, model_config: Any = UNSET
) -> PolicyFacts:
    """Read what the rules need from a resolved ``policy`` section and the worker's environment;
    ``model_config``: the model's ``config.json`` already read (``UNSET``: read it here)."""
    if not isinstance(policy_cfg, dict):
        raise policy_not_a_mapping(policy_cfg)
    environ = os.environ if environ is None else environ
    megatron_cfg = get_or_unset(policy_cfg, "megatron_cfg")
    mcfg = megatron_cfg if isinstance(megatron_cfg, dict) else {}
    backend_raw = get_or_unset(megatron_cfg, "attention_backend")
    overrides = get_or_unset(megatron_cfg, "model_overrides")
    cp = get_or_unset(megatron_cfg, "context_parallel_size")
    impl = get_or_unset(megatron_cfg, "transformer_impl")
    model_name = get_or_unset(policy_cfg, "model_name")
    env_vars = get_or_unset(megatron_cfg, "env_vars")
    fusion = mcfg.get("apply_rope_fusion", True)
    return PolicyFacts(
        megatron_enabled=megatron_enabled(policy_cfg),
        backend_raw=backend_raw,
        backend=backend_raw if isinstance(backend_raw, str) and backend_raw in BACKEND_NAMES else None,
        precision_raw=get_or_unset(policy_cfg, "precision"),
        pipeline_dtype_raw=get_or_unset(megatron_cfg, "pipeline_dtype"),
        transformer_impl=impl if isinstance(impl, str) and impl in TRANSFORMER_IMPLS else "transformer_engine",
        context_parallel_size=int(cp) if is_count(cp) else 1,
        model_name=model_name if isinstance(model_name, str) else None,
        model_overrides=overrides if isinstance(overrides, dict) else {},
        nvte_env=_nvte_env(env_vars, environ),
        tensor_parallel_size=Fact(
            mcfg.get("tensor_model_parallel_size", 1), "policy.megatron_cfg.tensor_model_parallel_size"
        ),
        apply_rope_fusion=fusion if isinstance(fusion, bool) else True,
        physical_batch=_first_positive(policy_cfg, "policy", "logprob_batch_size", "train_micro_batch_size"),
        env_vars=as_env_vars(env_vars),
        enabled_raw=get_or_unset(megatron_cfg, "enabled"),
        sequence_packing=sequence_packing_enabled(policy_cfg),
        seq_len=_first_positive(policy_cfg, "policy", "max_total_sequence_length"),
        te_env=_nvte_env(env_vars, environ, TE_SWITCHES),
        missing_indexed=tuple(
            entry for entry in MEGATRON_INDEXED_KEYS if isinstance(megatron_cfg, dict) and entry[0] not in mcfg
        ),
        model=read_model_facts(
            model_name,
            model_config,
            training_overrides=policy_cfg.get("hf_config_overrides"),
            rollout_overrides=value_at(policy_cfg, "generation.vllm_kwargs.hf_overrides"),
            model_overrides=overrides if isinstance(overrides, dict) else None,
        ),
        megatron_cfg_raw=megatron_cfg,
        model_name_raw=model_name,
        transformer_impl_raw=impl,
        model_overrides_raw=overrides,
        env_vars_raw=env_vars,
        generation_model=generation_model_config(policy_cfg),
        counts=_counts(policy_cfg, megatron_enabled(policy_cfg)),
        vllm_kwargs=_vllm_kwargs(policy_cfg),
        provider_settings=_provider_settings(mcfg, overrides),
        hf_config_overrides=section(policy_cfg, "hf_config_overrides"),
        nemo_rl_version=installed_nemo_rl(),
    )


def _provider_settings(megatron_cfg: Mapping[str, Any], overrides: Any) -> dict[str, Any]:
    """``PolicyFacts.provider_settings`` of a ``megatron_cfg`` mapping and its ``model_overrides``."""
    settings = {key: megatron_cfg[key] for key in PROVIDER_KEYS if key in megatron_cfg}
    if megatron_cfg.get("attention_backend") is not None:
        settings["attention_backend"] = megatron_cfg["attention_backend"]
    settings.update(overrides if isinstance(overrides, dict) else {})
    return settings


def _vllm_kwargs(policy_cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """``policy.generation.vllm_kwargs`` when NeMo-RL generates with vLLM, else empty."""
    generation = section(policy_cfg, "generation")
    return section(generation, "vllm_kwargs") if generation.get("backend") == "vllm" else {}
