"""Probe NeMo-RL's Megatron generation with the plugin active.

``python -m tests.real_nemo_rl.megatron_generation_probe TREE OUT.json CASE``

Run by ``test_megatron_generation.py`` in its own process, with the plugin's checkout, the
stand-ins and ``TREE`` on the path, the plugin activated by its ``.pth``. It records facts only;
the tests judge them.

* ``engines``: the real ``MegatronGenerationMixin._initialize_inference_engine`` (NeMo-RL's own
  code, wrapped by the hook at import) on a worker holding a real megatron-core ``GPTModel`` built
  on CPU: it builds the real ``InferenceConfig``, ``DynamicInferenceContext`` and
  ``GPTInferenceWrapper``; then the records the hook wrote. What cannot run on CPU is replaced,
  and only that: ``torch.cuda.current_device()`` answers ``"cpu"`` and tensor factories drop
  ``pin_memory`` (the context allocates its buffers there); ``HAVE_FLASHINFER`` is set (NeMo-RL asks
  for flashinfer's fused RoPE in bf16; flashinfer is a CUDA library); the ``TextGenerationController``
  and ``DynamicInferenceEngine`` (sampling and scheduling, which open CUDA streams) are
  ``StandInController`` / ``StandInEngine``, which keep their arguments. No attention kernel runs.
* ``recipes``: each shipped Megatron-generation recipe, loaded by NeMo-RL's own ``load_config``,
  with NeMo-RL's ``merged_inference_megatron_cfg`` / ``dedicated_inference_megatron_cfg`` /
  ``MegatronGeneration.effective_megatron_cfg`` beside the plugin's reading of the same recipe.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

#: The engine settings of the probe (NeMo-RL's keys; a small buffer and request count for CPU).
ENGINE_CFG = {
    "max_model_len": 128,
    "cuda_graph_impl": "none",
    "buffer_size_gb": 0.01,
    "num_cuda_graphs": 1,
    "block_size_tokens": 64,
    "use_cuda_graphs_for_non_decode_steps": False,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
    "max_tokens": 256,
    "kv_cache_management_mode": "persist",
    "materialize_only_last_token_logits": True,
    "num_speculative_tokens": 0,
    "max_requests": 16,
}
#: Model configs probed: NeMo-RL's default (bf16, flash-attn version left to the engine) and
#: batch-invariant mode (megatron-core asserts flash, a pinned flash-attn 3/4 and CP 1 for it).
CASES = {
    "default": {},
    "batch_invariant": {
        "attention_backend": "flash",
        "flash_attention_version": 3,
        "batch_invariant_mode": True,
        "attention_dropout": 0.0,
    },
}


class StandInController:
    """Stand-in for megatron-core's ``TextGenerationController`` (it opens CUDA streams)."""

    def __init__(self, inference_wrapped_model, tokenizer):
        self.inference_wrapped_model = inference_wrapped_model


class StandInEngine:
    """Stand-in for megatron-core's ``DynamicInferenceEngine`` (scheduling on CUDA)."""

    def __init__(self, controller, context):
        self.controller, self.context = controller, context


def _cpu_only() -> None:
    import torch

    torch.cuda.current_device = lambda: "cpu"
    for name in ("full", "empty", "zeros", "ones", "arange", "tensor", "empty_like", "zeros_like", "full_like"):
        factory = getattr(torch, name)

        def without_pinning(*args, _factory=factory, **kwargs):
            kwargs.pop("pin_memory", None)
            return _factory(*args, **kwargs)

        setattr(torch, name, functools.wraps(factory)(without_pinning))
    import megatron.core.inference.contexts.dynamic_context as dynamic_context
    import megatron.core.inference.engines.dynamic_engine as dynamic_engine
    import megatron.core.inference.text_generation_controllers.text_generation_controller as controller

    dynamic_context.HAVE_FLASHINFER = True
    controller.TextGenerationController = StandInController
    dynamic_engine.DynamicInferenceEngine = StandInEngine


def _records(report_dir: Path) -> dict[str, Any]:
    out = {}
    for path in sorted(report_dir.glob("*/*.json")):
        out[f"{path.parent.name}/{path.name}"] = json.loads(path.read_text())
    return out


def engine(case: str, report_dir: Path) -> dict[str, Any]:
    """Initialize the real inference engine once for model config ``case``; what the hook wrote."""
    import torch
    from megatron.core.transformer.enums import AttnBackend
    from nemo_rl.models.generation.megatron import megatron_worker

    from tests.fake_nemo_rl.cpu_megatron import TINY_MODEL, StandInGPTProvider, build_gpt

    overrides = dict(CASES[case])
    if "attention_backend" in overrides:
        overrides["attention_backend"] = AttnBackend[overrides["attention_backend"]]
    model_cfg = StandInGPTProvider(
        **TINY_MODEL, params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True, **overrides
    )
    model = build_gpt(model_cfg)

    class Worker(megatron_worker.MegatronGenerationMixin):
        def __init__(self):
            self.rank, self.model, self.megatron_tokenizer = 0, model, None
            self.cfg: dict[str, Any] = {"generation": {"backend": "megatron"}}
            self.is_generation_colocated = True
            self._init_inference_engine_state()

    worker = Worker()
    os.environ["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] = str(report_dir)
    seam = vars(megatron_worker.MegatronGenerationMixin)["_initialize_inference_engine"]
    result: dict[str, Any] = {"seam_module": seam.__module__, "seam_name": seam.__name__}
    try:
        worker._initialize_inference_engine(ENGINE_CFG)
        worker._initialize_inference_engine(ENGINE_CFG)  # NeMo-RL returns at once: no second record
        result["context_class"] = (
            type(worker.inference_context).__module__ + "." + type(worker.inference_context).__name__
        )
        result["wrapper_class"] = type(worker.inference_wrapped_model).__name__
    except Exception as exc:  # the test reports it
        result["error"] = "".join(traceback.format_exception(exc))
    result["records"] = _records(report_dir)
    return result


def recipes(tree: Path) -> dict[str, Any]:
    """NeMo-RL's reading and the plugin's of every shipped Megatron-generation recipe."""
    from nemo_rl.models.generation.megatron.config import (
        dedicated_inference_megatron_cfg,
        merged_inference_megatron_cfg,
    )
    from nemo_rl.models.generation.megatron.megatron_generation import MegatronGeneration
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    from nemo_rl_attn_align.hosts.megatron_generation import is_generation_only
    from nemo_rl_attn_align.preflight.facts import LAYOUT_KEYS
    from nemo_rl_attn_align.preflight.megatron_generation_facts import read_megatron_generation_facts

    register_omegaconf_resolvers()
    out = {}
    for path in sorted((tree / "examples" / "configs").rglob("*.yaml")):
        text = path.read_text()
        if "backend: megatron" not in text:
            continue
        try:
            cfg = OmegaConf.to_container(load_config(str(path)), resolve=True)
        except Exception as exc:
            out[path.name] = {"load_error": repr(exc)}
            continue
        policy = cfg["policy"]
        if policy["generation"]["backend"] != "megatron":
            continue
        colocated = policy["generation"]["colocated"]["enabled"]
        dedicated = dedicated_inference_megatron_cfg(policy) if colocated else merged_inference_megatron_cfg(policy)
        used = (
            MegatronGeneration.effective_megatron_cfg(policy)
            if not colocated
            else (dedicated or policy["megatron_cfg"])
        )
        facts = read_megatron_generation_facts(policy)
        out[path.name] = {
            "colocated": colocated,
            "host_dedicated": dedicated is not None,
            "host_layout": {key: used.get(key) for key in LAYOUT_KEYS},
            "host_impl": used.get("transformer_impl"),
            "generation_only_worker": is_generation_only({**policy, "megatron_cfg": used}) if not colocated else None,
            "training_worker_generation_only": is_generation_only(policy),
            "plugin_colocated": facts.colocated,
            "plugin_dedicated": facts.dedicated,
            "plugin_tp": facts.model.tensor_parallel_size.value,
            "plugin_impl": facts.model.transformer_impl,
        }
    return out


def main(tree: Path, out: Path, case: str) -> None:
    _cpu_only()
    with tempfile.TemporaryDirectory() as report_dir:
        result = {"engine": engine(case, Path(report_dir))}
    if case == "default":
        result["recipes"] = recipes(tree)
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
