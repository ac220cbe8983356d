"""The recipe, read once: typed, frozen facts that the rules, the preview and drift consume.

``read_recipe_facts(cfg, environ)`` reads a resolved NeMo-RL config (a plain dict, as
``config.load_config`` returns it) into ``RecipeFacts``: ``policy`` (``PolicyFacts``, what the
pre-flight rules and the training preview need, with the NVTE variables the Megatron worker will
see), ``generation`` (``GenerationFacts``, the vLLM rollout settings) and ``shape`` (``ShapeFacts``,
the attention-shape layers drift resolves a shape from). ``read_policy_facts`` reads a ``policy``
section alone, which is what a Megatron policy worker receives.

A value the host cannot use is kept as written where a consumer reports it (``PolicyFacts.raw``);
elsewhere a section that is not a mapping reads as empty, as NeMo-RL's own ``.get`` chains do, so
the rules, not the readers, say what is wrong. A ``Fact`` keeps the dotted config key it came from.
Stdlib only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.errors import UsageError
from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, DEFAULT_BACKEND, NVTE_VARIABLES

#: ``policy.precision`` values NeMo-RL accepts (``setup.py::validate_and_set_config`` dtype_map).
PRECISIONS = ("float32", "bfloat16", "float16")
#: ``TransformerConfig.transformer_impl`` (megatron-core 0.16: ``Literal['local', 'transformer_engine',
#: 'inference_optimized']``).
TRANSFORMER_IMPLS = ("transformer_engine", "local", "inference_optimized")

#: Marks a key that is absent from the config (as opposed to present with value null).
UNSET = type("Unset", (), {"__repr__": lambda self: "<unset>"})()
#: The ``policy.megatron_cfg`` keys NeMo-RL's ``Policy.__init__`` indexes without a default once
#: Megatron is enabled, so a recipe without one dies with a KeyError before any worker starts; each
#: with the value the fix adds (the single-GPU layout). Source: nemo_rl/models/policy/lm_policy.py,
#: lines 143-145 at 7ea279a, 115-117 at v0.7.0, 108-110 at v0.6.0, 91-93 at v0.5.0 (the same three).
MEGATRON_INDEXED_KEYS: tuple[tuple[str, int], ...] = (
    ("tensor_model_parallel_size", 1),  # tp_size = config["megatron_cfg"]["tensor_model_parallel_size"]
    ("pipeline_model_parallel_size", 1),  # pp_size = config["megatron_cfg"]["pipeline_model_parallel_size"]
    ("context_parallel_size", 1),  # cp_size = config["megatron_cfg"]["context_parallel_size"]
)
#: TE switches beyond the three Megatron sets that the worker environment may carry.
TE_SWITCHES = ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FLASH_ATTN_V2", "NVTE_FLASH_ATTN_V3", "NVTE_FLASH_ATTN_V4")
#: ``TransformerConfig.softmax_type`` (``Literal['vanilla', 'off-by-one', 'learnable']``).
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
#: Models whose Megatron provider uses learnable softmax sinks (NeMo-RL issue #1685).
LEARNABLE_SOFTMAX_MODELS = re.compile(r"gpt-oss", re.IGNORECASE)


def is_count(value: Any) -> bool:
    """An integer >= 1 as NeMo-RL and Megatron use it (``True`` is Python's 1, so it counts)."""
    return isinstance(value, int) and value >= 1


def _positive(value: Any) -> int | None:
    """``value`` when it is a positive int (a batch or step count; not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class Fact:
    """One config value and the dotted key it was read from."""

    value: Any
    key: str


def _first_positive(section: Mapping[str, Any], prefix: str, *names: str) -> Fact:
    """The first of ``names`` in ``section`` holding a positive int, with its key; else None at the first."""
    for name in names:
        value = _positive(section.get(name))
        if value is not None:
            return Fact(value, f"{prefix}.{name}")
    return Fact(None, f"{prefix}.{names[0]}")


def _get(node: Any, key: str) -> Any:
    return node.get(key, UNSET) if isinstance(node, dict) else UNSET


def _at(cfg: Any, dotted: str) -> Any:
    """The value at a dotted key of nested dicts, None where a level is missing or not a dict."""
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


def _mapping(node: Any, key: str) -> Mapping[str, Any]:
    """``node[key]`` when it is a mapping, else empty (a malformed section is NeMo-RL's to report)."""
    value = node.get(key) if isinstance(node, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _env_vars(value: Any) -> dict[str, str]:
    """``env_vars`` as the worker gets them (``str`` of each name and value); {} when not a mapping
    (a non-mapping env_vars is NeMo-RL's error to report)."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


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
    #: The values as written (``UNSET`` when absent), for ``_config_values``; the fields above hold
    #: what the other rules use (a default where the value is unusable, which is then an error).
    raw: dict = field(default_factory=dict)
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

    @property
    def has_megatron_cfg(self) -> bool:
        """Whether ``policy.megatron_cfg`` is a mapping."""
        return isinstance(self.raw.get("megatron_cfg"), dict)

    @property
    def precision(self) -> str | None:
        """``policy.precision`` when valid, else None."""
        return self.precision_raw if self.precision_raw in PRECISIONS else None

    @property
    def softmax_type(self) -> Fact:
        """The softmax Megatron's attention uses: ``model_overrides.softmax_type`` when valid, learnable
        for gpt-oss (its provider's sinks), else vanilla."""
        key = "policy.megatron_cfg.model_overrides.softmax_type"
        written = self.model_overrides.get("softmax_type")
        if isinstance(written, str) and written in SOFTMAX_TYPES:
            return Fact(written, key)
        if self.model_name and LEARNABLE_SOFTMAX_MODELS.search(self.model_name):
            return Fact("learnable", "policy.model_name (gpt-oss: learnable softmax sinks)")
        return Fact("vanilla", f"{key} not set: vanilla")

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
    megatron_cfg = _get(policy_cfg, "megatron_cfg")
    return isinstance(megatron_cfg, dict) and bool(megatron_cfg.get("enabled", False))


def _nvte_env(
    megatron_cfg: Any, environ: Mapping[str, str], names: tuple[str, ...] = NVTE_VARIABLES
) -> dict[str, tuple[str, str]]:
    env_vars = _get(megatron_cfg, "env_vars")
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


def read_policy_facts(policy_cfg: Any, environ: Mapping[str, str] | None = None) -> PolicyFacts:
    """Read what the rules need from a resolved ``policy`` section and the worker's environment."""
    if not isinstance(policy_cfg, dict):
        raise policy_not_a_mapping(policy_cfg)
    environ = os.environ if environ is None else environ
    megatron_cfg = _get(policy_cfg, "megatron_cfg")
    mcfg = megatron_cfg if isinstance(megatron_cfg, dict) else {}
    backend_raw = _get(megatron_cfg, "attention_backend")
    overrides = _get(megatron_cfg, "model_overrides")
    cp = _get(megatron_cfg, "context_parallel_size")
    impl = _get(megatron_cfg, "transformer_impl")
    model_name = _get(policy_cfg, "model_name")
    fusion = mcfg.get("apply_rope_fusion", True)
    return PolicyFacts(
        megatron_enabled=megatron_enabled(policy_cfg),
        backend_raw=backend_raw,
        backend=backend_raw if isinstance(backend_raw, str) and backend_raw in BACKEND_NAMES else None,
        precision_raw=_get(policy_cfg, "precision"),
        pipeline_dtype_raw=_get(megatron_cfg, "pipeline_dtype"),
        transformer_impl=impl if isinstance(impl, str) and impl in TRANSFORMER_IMPLS else "transformer_engine",
        context_parallel_size=int(cp) if is_count(cp) else 1,
        model_name=model_name if isinstance(model_name, str) else None,
        model_overrides=overrides if isinstance(overrides, dict) else {},
        nvte_env=_nvte_env(megatron_cfg, environ),
        raw={
            "megatron_cfg": megatron_cfg,
            "model_name": model_name,
            "transformer_impl": impl,
            "context_parallel_size": cp,
            "model_overrides": overrides,
            "env_vars": _get(megatron_cfg, "env_vars"),
        },
        tensor_parallel_size=Fact(
            mcfg.get("tensor_model_parallel_size", 1), "policy.megatron_cfg.tensor_model_parallel_size"
        ),
        apply_rope_fusion=fusion if isinstance(fusion, bool) else True,
        physical_batch=_first_positive(policy_cfg, "policy", "logprob_batch_size", "train_micro_batch_size"),
        env_vars=_env_vars(_get(megatron_cfg, "env_vars")),
        enabled_raw=_get(megatron_cfg, "enabled"),
        sequence_packing=bool(_at(policy_cfg, "sequence_packing.enabled")),
        seq_len=_first_positive(policy_cfg, "policy", "max_total_sequence_length"),
        te_env=_nvte_env(megatron_cfg, environ, TE_SWITCHES),
        missing_indexed=tuple(
            entry for entry in MEGATRON_INDEXED_KEYS if isinstance(megatron_cfg, dict) and entry[0] not in mcfg
        ),
    )


_VLLM_CFG = "policy.generation.vllm_cfg"


def vllm_batch_invariant(env: Mapping[str, str | None]) -> bool:
    """Whether ``VLLM_BATCH_INVARIANT`` turns the mode on (vLLM reads it as an integer != 0)."""
    try:
        return int(env.get("VLLM_BATCH_INVARIANT") or "0") != 0
    except ValueError:
        return False


@dataclass(frozen=True)
class GenerationFacts:
    """``policy.generation``: the rollout backend and, for vLLM, the settings the rollout preview reads.
    A value is as written, or vLLM's / NeMo-RL's default where the key is absent; None when unset."""

    backend: Any = None
    #: ``vllm_cfg.precision`` when present, else ``policy.precision`` (the key says which).
    precision: Fact = Fact(None, f"{_VLLM_CFG}.precision")
    kv_cache_dtype: Fact = Fact("auto", f"{_VLLM_CFG}.kv_cache_dtype")
    tensor_parallel_size: Fact = Fact(1, f"{_VLLM_CFG}.tensor_parallel_size")
    enable_prefix_caching: Fact = Fact(None, f"{_VLLM_CFG}.enable_prefix_caching")
    #: ``vllm_cfg.env_vars`` as the worker gets them.
    env_vars: Mapping[str, str] = field(default_factory=dict)
    #: ``vllm_kwargs`` values (engine arguments).
    attention_backend: Any = None
    block_size: Any = None
    enable_chunked_prefill: Any = True
    max_num_batched_tokens: Any = None
    max_num_seqs: Any = None

    @property
    def is_vllm(self) -> bool:
        """Whether NeMo-RL starts vLLM generation workers (``policy.generation.backend: vllm``)."""
        return self.backend == "vllm"


def read_generation_facts(cfg: Any) -> GenerationFacts:
    """Read ``policy.generation`` of a resolved config (empty facts where it is not a mapping)."""
    gen = _at(cfg, "policy.generation")
    if not isinstance(gen, Mapping):
        return GenerationFacts()
    vcfg, kwargs = _mapping(gen, "vllm_cfg"), _mapping(gen, "vllm_kwargs")
    return GenerationFacts(
        backend=gen.get("backend"),
        precision=(
            Fact(vcfg["precision"], f"{_VLLM_CFG}.precision")
            if "precision" in vcfg
            else Fact(_at(cfg, "policy.precision"), "policy.precision")
        ),
        kv_cache_dtype=Fact(vcfg.get("kv_cache_dtype", "auto"), f"{_VLLM_CFG}.kv_cache_dtype"),
        tensor_parallel_size=Fact(vcfg.get("tensor_parallel_size", 1), f"{_VLLM_CFG}.tensor_parallel_size"),
        enable_prefix_caching=Fact(vcfg.get("enable_prefix_caching"), f"{_VLLM_CFG}.enable_prefix_caching"),
        env_vars=_env_vars(_at(cfg, f"{_VLLM_CFG}.env_vars")),
        attention_backend=kwargs.get("attention_backend"),
        block_size=kwargs.get("block_size"),
        enable_chunked_prefill=kwargs.get("enable_chunked_prefill", True),
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens"),
        max_num_seqs=kwargs.get("max_num_seqs"),
    )


def _left_window(value: Any) -> Any:
    """Megatron's ``window_size`` is ``(left, right)``; keep the left size (``-1``/None: none)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value in (None, -1) else value


def _hf_window(hf: dict) -> Any:
    """HF ``sliding_window`` counts the query itself; the left window is one less."""
    window = hf.get("sliding_window")
    if hf.get("use_sliding_window") is False or window in (None, 0):
        return None
    return window - 1 if isinstance(window, int) and not isinstance(window, bool) else window


@dataclass(frozen=True)
class ShapeFacts:
    """What the config says about the attention shape, in drift's field names (``heads``, ``kv_heads``,
    ``head_dim``, ``window``, ``hidden``, ``seq_len``).

    ``layers`` are the config's sections that set shape fields, highest priority first, each a
    ``Fact`` whose value maps field -> value (None: not set there) and whose key is the section;
    ``seq_len`` is ``policy.max_total_sequence_length`` (None when unset)."""

    layers: tuple[Fact, ...] = ()
    seq_len: Fact | None = None


def read_shape_facts(cfg: Any) -> ShapeFacts:
    """Read the attention-shape layers of a resolved config (none where a section is not a dict)."""
    layers = []
    drift = _at(cfg, "attention_align.drift")
    if isinstance(drift, dict):
        layers.append(Fact(dict(drift), "attention_align.drift"))
    mo = _at(cfg, "policy.megatron_cfg.model_overrides")
    if isinstance(mo, dict):
        layers.append(
            Fact(
                {
                    "heads": mo.get("num_attention_heads"),
                    "kv_heads": mo.get("num_query_groups"),
                    "head_dim": mo.get("kv_channels"),
                    "window": _left_window(mo.get("window_size")),
                    "hidden": mo.get("hidden_size"),
                },
                "policy.megatron_cfg.model_overrides",
            )
        )
    hf = _at(cfg, "policy.hf_config_overrides")
    if isinstance(hf, dict):
        layers.append(
            Fact(
                {
                    "heads": hf.get("num_attention_heads"),
                    "kv_heads": hf.get("num_key_value_heads"),
                    "head_dim": hf.get("head_dim"),
                    "window": _hf_window(hf),
                    "hidden": hf.get("hidden_size"),
                },
                "policy.hf_config_overrides",
            )
        )
    seq = _at(cfg, "policy.max_total_sequence_length")
    seq_fact = Fact(seq, "policy.max_total_sequence_length") if seq is not None else None
    return ShapeFacts(tuple(layers), seq_fact)


@dataclass(frozen=True)
class RecipeFacts:
    """A whole recipe's facts. ``policy`` is None when the ``policy`` section is not a mapping
    (``require_policy`` then raises the one-line error the rules' reader raises)."""

    policy: PolicyFacts | None
    generation: GenerationFacts
    shape: ShapeFacts
    #: ``policy.model_name`` as written (None when unset), which ``hf_model`` looks up locally.
    model_name: Any = None
    #: ``policy.tokenizer.name``, else ``policy.model_name`` (falsy when neither is set).
    tokenizer: Any = None
    #: ``grpo.num_prompts_per_step`` x ``grpo.num_generations_per_prompt`` when both are positive ints.
    rollout_batch_size: int | None = None
    #: the ``policy`` section as written (for the error ``require_policy`` raises).
    policy_raw: Any = None

    @property
    def megatron_enabled(self) -> bool:
        """Whether NeMo-RL trains this policy with Megatron (see ``megatron_enabled``)."""
        return self.policy is not None and self.policy.megatron_enabled

    def require_policy(self) -> PolicyFacts:
        """``policy``, or the ``UsageError`` for a ``policy`` section that is not a mapping."""
        if self.policy is None:
            raise policy_not_a_mapping(self.policy_raw)
        return self.policy


def read_recipe_facts(cfg: Any, environ: Mapping[str, str] | None = None) -> RecipeFacts:
    """Read a resolved NeMo-RL config once; ``environ`` (default ``os.environ``) is the driver
    environment the workers inherit."""
    policy_raw = cfg.get("policy") if isinstance(cfg, Mapping) else None
    policy = read_policy_facts(policy_raw, environ) if isinstance(policy_raw, dict) else None
    prompts = _positive(_at(cfg, "grpo.num_prompts_per_step"))
    generations = _positive(_at(cfg, "grpo.num_generations_per_prompt"))
    return RecipeFacts(
        policy=policy,
        generation=read_generation_facts(cfg),
        shape=read_shape_facts(cfg),
        model_name=_at(cfg, "policy.model_name"),
        tokenizer=_at(cfg, "policy.tokenizer.name") or _at(cfg, "policy.model_name"),
        rollout_batch_size=prompts * generations if prompts and generations else None,
        policy_raw=policy_raw,
    )


def as_facts(cfg: Any, environ: Mapping[str, str] | None = None) -> RecipeFacts:
    """``cfg`` when it already is ``RecipeFacts``, else ``read_recipe_facts(cfg, environ)``: the public
    functions of the preview and drift take either, so a caller reads the recipe once."""
    return cfg if isinstance(cfg, RecipeFacts) else read_recipe_facts(cfg, environ)
