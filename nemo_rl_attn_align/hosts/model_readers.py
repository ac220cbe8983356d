"""The model's attention as each host builds it from a ``config.json`` directory, read by the host's own code.

* ``read_megatron(path, overrides)``: Megatron-Bridge's conversion, as NeMo-RL runs it
  (``AutoConfig.from_pretrained(path, **policy.hf_config_overrides)`` -> ``AutoBridge.from_hf_config``
  -> ``to_megatron_provider(load_weights=False)`` -> ``finalize()``), and the provider's attention
  attributes (``MEGATRON_ATTRIBUTES``: the ``TransformerConfig`` Megatron builds the model from).
  Where the provider's layer spec names a core-attention module of its own (not megatron-core's:
  Gemma 2's, Gemma 3's), that module is built for each layer as megatron-core builds it and read
  (``own_layer_facts``: the window, scale and soft cap it holds or hands Transformer Engine).
* ``read_vllm(path, hf_overrides)``: the configs vLLM's ``EngineArgs`` make for the directory (as
  ``LLM(...)`` does, with dummy weights) and its model class built on the meta device (no weights,
  no memory), then every attention layer the model code made:
  its module, heads, head sizes, window, sinks, MLA ranks, and the ``AttentionSelectorConfig`` the
  layer handed vLLM's backend selector (``selector.*``). Where this platform has no backend for a
  layer (sparse MLA on CPU), the layer is built with the dense one: its facts are read, not run.

No weights are read and nothing is downloaded. ``python -m nemo_rl_attn_align.hosts.model_readers
megatron|vllm OUT.json DIR [DIR ...]`` reads several directories in one process (the generator of
``model/tables/architectures.json`` and ``check`` where a host is installed run it as a
subprocess: vLLM's reader initialises torch.distributed). Each result is JSON-ready; a directory the
host cannot read gives ``{"error": "..."}`` with the host's own message.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from nemo_rl_attn_align.model.model_attention import MEGATRON_ATTRIBUTES, left_window, vllm_layer_facts
from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK

#: Names of provider fields that may change attention (``_own_attention_fields``).
OWN_FIELD_PATTERN = re.compile(r"attn|attention|window|sink|softmax|head_dim")
#: The ``AttentionSelectorConfig`` fields a layer decides (the rest come from the engine's settings).
SELECTOR_FIELDS = ("head_size", "use_mla", "has_sink", "use_sparse", "has_sliding_window", "attn_type")


def plain(value: Any) -> Any:
    """JSON-ready form of a host value: enums by value, tuples as lists, other objects by name."""
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return str(value)


def megatron_provider(path: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Megatron-Bridge's provider for the ``config.json`` in ``path`` (``overrides``: NeMo-RL's
    ``policy.hf_config_overrides``, set on the HF config as ``from_pretrained(**kwargs)`` sets them),
    not finalized and without weights."""
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(path, **dict(overrides or {}))
    return AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)


def read_megatron(path: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Megatron-Bridge's provider for the ``config.json`` in ``path``: its class and attention attributes."""
    provider = megatron_provider(path, overrides)
    provider.finalize()
    missing = object()
    values = {name: getattr(provider, name, missing) for name in MEGATRON_ATTRIBUTES}
    reading: dict[str, Any] = {
        "provider": type(provider).__name__,
        "attributes": {name: plain(v) for name, v in values.items() if v is not missing},
        "own_fields": _own_attention_fields(provider),
    }
    own = _own_core_attention(provider)
    if own is not None:
        reading["layers"] = _own_layers(provider, *own)
    return reading


def _own_core_attention(provider: Any) -> tuple[Any, Any] | None:
    """The self-attention spec and core-attention spec of the provider's layer spec where the core
    attention is the provider's own (a class outside megatron-core); None for megatron-core's own, a
    provider or spec without one, or ``attention_backend`` local (``GPTModelProvider.provide`` then builds
    megatron-core's ``DotProductAttention`` in its place). Spec functions read the model-parallel
    state: a group of one is made first."""
    import inspect

    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = getattr(provider, "transformer_layer_spec", None)  # a hybrid (Mamba) provider has none
    if spec is None:
        return None
    ensure_model_parallel()
    if not isinstance(spec, ModuleSpec):
        spec = spec(provider, vp_stage=None) if "vp_stage" in inspect.signature(spec).parameters else spec(provider)
    attention = getattr(getattr(spec, "submodules", None), "self_attention", None)
    core = getattr(getattr(attention, "submodules", None), "core_attention", None)
    module = core.module if isinstance(core, ModuleSpec) else core
    if not isinstance(module, type) or module.__module__.startswith("megatron.core."):
        return None
    return None if provider.attention_backend == AttnBackend.local else (attention, core)


def _own_layers(provider: Any, attention: Any, core: Any) -> list[dict[str, Any]]:
    """Each layer's ``own_layer_facts``, from its core-attention module built as megatron-core's
    ``SelfAttention`` builds it (the provider as config, the layer's 1-based number, the spec's mask
    type, the config's ``softmax_scale``) in a model-parallel group of one: no weights are made."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module

    groups = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
    mask = getattr(attention, "params", {}).get("attn_mask_type", AttnMaskType.padding)
    facts = []
    with TransformerEngineArguments() as handed, cpu_only():
        for number in range(1, provider.num_layers + 1):
            module = build_module(
                core,
                config=provider,
                layer_number=number,
                attn_mask_type=mask,
                attention_type="self",
                cp_comm_type=None,
                softmax_scale=provider.softmax_scale,
                pg_collection=groups,
            )
            facts.append(own_layer_facts(module, handed))
    return facts


class TransformerEngineArguments(dict):
    """Inside: the keyword arguments megatron-core hands Transformer Engine's ``DotProductAttention``
    (the class its ``TEDotProductAttention`` extends), by the id of the module built."""

    def __enter__(self) -> TransformerEngineArguments:
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        self._base = TEDotProductAttention.__bases__[0]
        self._init = self._base.__init__
        init = self._init

        def __init__(module, *args, **kwargs):
            self[id(module)] = kwargs
            init(module, *args, **kwargs)

        self._base.__init__ = __init__
        return self

    def __exit__(self, *exc: object) -> None:
        self._base.__init__ = self._init


def own_layer_facts(core: Any, handed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """``MEGATRON_OWN_LAYER_FACTS`` of one layer's core-attention module: for one built on Transformer
    Engine's ``DotProductAttention``, what megatron-core ``handed`` it (its left window; its
    ``softmax_scale``, else ``1/sqrt(kv_channels)``; no soft cap; ``module`` None: TE's kernels run
    it); for another, the mask and softmax the Megatron worker's behaviour reader reads of it
    (``megatron_behaviour.core_kind``), and its class as ``module``."""
    import math

    from nemo_rl_attn_align.hosts.megatron_behaviour import core_kind

    if id(core) in handed:
        kwargs = handed[id(core)]
        channels = kwargs.get("kv_channels")
        channels = channels[0] if isinstance(channels, (list, tuple)) else channels
        scale = kwargs.get("softmax_scale") or (1.0 / math.sqrt(channels) if channels else None)
        window = left_window(plain(kwargs.get("window_size")))
        return {"window": window, "softmax_scale": scale, "softcap": 0.0, "module": None}
    (mask, _), (softmax, _) = core_kind(core, 0), core_kind(core, 1)
    return {
        "window": mask["window"],
        "softmax_scale": softmax["scale"],
        "softcap": softmax["softcap"] or 0.0,
        "module": type(core).__name__,
    }


def _own_attention_fields(provider: Any) -> dict[str, Any]:
    """The provider's own attention-looking fields (not megatron-core's): the plugin does not read them,
    so a reading that depends on them says so."""
    import dataclasses

    from megatron.core.transformer import MLATransformerConfig

    core = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    return {
        f.name: plain(getattr(provider, f.name))
        for f in dataclasses.fields(provider)
        if f.name not in core and OWN_FIELD_PATTERN.search(f.name) and getattr(provider, f.name)
    }


class _SelectorRecorder:
    """Records the ``AttentionSelectorConfig`` each attention layer hands vLLM's selector, by layer name."""

    def __init__(self) -> None:
        self.building: list[str] = []
        self.configs: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from vllm.model_executor.layers.attention import attention, mla_attention
        from vllm.v1.attention import selector

        inits = {cls: cls.__init__ for cls in (attention.Attention, mla_attention.MLAAttention)}
        cached = selector._cached_get_attn_backend

        def select(*args, **kwargs):
            config = kwargs.get("attn_selector_config")
            if self.building and config is not None:
                self.configs[self.building[-1]] = {f: plain(getattr(config, f, None)) for f in SELECTOR_FIELDS}
            try:
                return cached(*args, **kwargs)
            except NotImplementedError:  # this platform has no such backend (sparse MLA on CPU): the layer's
                if config is None or not getattr(config, "use_sparse", False):  # facts are read, not run
                    raise
                return cached(*args, **{**kwargs, "attn_selector_config": config._replace(use_sparse=False)})

        def recording(init):
            def __init__(layer, *args, **kwargs):
                self.building.append(str(kwargs.get("prefix", "")))
                try:
                    init(layer, *args, **kwargs)
                finally:
                    self.building.pop()

            return __init__

        selector._cached_get_attn_backend = select
        for cls, init in inits.items():
            cls.__init__ = recording(init)
        try:
            yield
        finally:
            selector._cached_get_attn_backend = cached
            for cls, init in inits.items():
                cls.__init__ = init


_distributed_ready = False


def _init_distributed(vllm_config: Any) -> None:
    """One process group of one rank (gloo, a file rendezvous: no port), as vLLM's layers need."""
    global _distributed_ready
    if _distributed_ready:
        return
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    rendezvous = os.path.join(tempfile.mkdtemp(prefix="attn-align-vllm-"), "rendezvous")
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=f"file://{rendezvous}", local_rank=0, backend="gloo"
        )
    with set_current_vllm_config(VllmConfig()):  # no model config: every group, the expert one included
        initialize_model_parallel(1, 1)
    _distributed_ready = True


def _cpu_backend() -> dict[str, str]:
    """On a CPU, vLLM (0.32 and later) picks AMX_MLA for MLA layers where the CPU has AMX tiles, and its
    impl refuses the sparse layers' arguments: CPU_MLA, which every CPU builds, is asked for instead
    (non-MLA layers run CPU_ATTN either way). Nothing elsewhere, nor where vLLM has no AMX_MLA."""
    from vllm.platforms import current_platform

    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:  # before vLLM 0.15
        return {}
    amx = "AMX_MLA" in AttentionBackendEnum.__members__
    return {"attention_backend": "CPU_MLA"} if amx and current_platform.is_cpu() else {}


#: What ``meta_vllm_model`` sets over the engine arguments: no tokenizer, no weights, no compilation.
META_ENGINE_ARGS = {"skip_tokenizer_init": True, "load_format": "dummy", "enforce_eager": True}


def meta_vllm_model(engine_kwargs: Mapping[str, Any]) -> tuple[Any, Any, _SelectorRecorder]:
    """vLLM's model for ``EngineArgs(**engine_kwargs)`` (``LLM(...)``'s arguments: ``model``, ``dtype``,
    ``hf_overrides``, ...), built on the meta device as its engine would build it (no weights, no
    memory); its ``VllmConfig`` (the attention layers register in its ``static_forward_context``) and
    the selector configs the layers handed vLLM's backend selector."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import get_model_architecture

    kwargs = {"tokenizer": engine_kwargs.get("model"), **_cpu_backend(), **engine_kwargs, **META_ENGINE_ARGS}
    vllm_config = EngineArgs(**kwargs).create_engine_config()  # the engine's own configs (its cache config's window)
    _init_distributed(vllm_config)
    recorder = _SelectorRecorder()
    with set_current_vllm_config(vllm_config), recorder.installed(), torch.device("meta"):
        model_class, _ = get_model_architecture(vllm_config.model_config)
        model = model_class(vllm_config=vllm_config, prefix="")
    return model, vllm_config, recorder


def read_vllm(path: str, hf_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's model for the ``config.json`` in ``path``, built on the meta device: its attention layers."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    engine_kwargs = {"model": path, "dtype": "bfloat16", "hf_overrides": dict(hf_overrides or {})}
    model, vllm_config, recorder = meta_vllm_model(engine_kwargs)
    model_config = vllm_config.model_config
    modules = dict(model.named_modules())
    named = [
        (str(getattr(module, "layer_name", None) or name), module)
        for name, module in modules.items()
        if isinstance(module, AttentionLayerBase)
    ]
    layers = vllm_layer_facts(named, recorder.configs, modules)
    total = model_config.get_total_num_hidden_layers()
    return {
        "architecture": type(model).__name__,
        "num_layers": total,
        "use_mla": bool(model_config.use_mla),
        "layers": [layers.get(index) for index in range(total)],
    }


READERS = {"megatron": read_megatron, "vllm": read_vllm}


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:600]


def read_each(host: str, paths: list[str]) -> list[dict[str, Any]]:
    """``READERS[host]`` on each directory; a directory the host cannot read gives ``{"error": ...}``."""
    out = []
    for path in paths:
        try:
            out.append(READERS[host](path))
        except Exception as err:  # the host's own refusal is the answer for this config
            out.append({"error": one_line(err)})
    return out


def main(argv: list[str]) -> int:
    """``megatron|vllm OUT.json DIR [DIR ...]``: read each DIR, write the results as one JSON list."""
    host, out, *paths = argv
    results = read_each(host, paths)
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(jsonio.dumps(results))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
