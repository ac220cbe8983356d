"""One tiny GPTModel on CUDA through the plugin's hooked NeMo-RL path: ``python -m tests.gpu.model_runner SPEC RESULT``.

Which NeMo-RL it drives is ``nemo_rl_host.locate()``'s answer, reported as ``result["nemo_rl"]``:

* the real NeMo-RL, wherever ``nemo_rl`` is importable (a NeMo-RL container): its worker path as
  ``MegatronPolicyWorker.__init__`` runs it (``real_worker.py``: ``setup_distributed``,
  ``validate_and_set_config``, ``setup_model_and_optimizer`` without optimizer or weights) on a tiny
  checkpoint written from the case's model, with the checkout's own GRPO recipe as the policy;
* the stand-in NeMo-RL >= 0.6 layout (``tests/fake_nemo_rl/v0_6``: NeMo-RL's module paths, seams
  and call chain) only where NeMo-RL is absent; its model builder (``setup.build_gpt``, a CPU
  local-spec GPTModel) is replaced by one that builds on CUDA with the layer spec
  ``transformer_impl`` names: the real TE spec or the local one.

Either way the plugin's bootstrap is active, so the real hooks wrap the seams:
``_apply_performance_config`` runs ``check_policy`` (plan + rules), ``validate_and_set_config``
records the finished model config, ``setup_model_and_optimizer`` records the NVTE variables
Megatron set and arms the TE read-back for the first forward.

Spec (JSON): ``policy`` (a ``cases.policy_config``), ``seed``, ``batch``, ``seq``, ``deterministic``
(``torch.use_deterministic_algorithms``; the parent sets NVTE_ALLOW_NONDETERMINISTIC_ALGO and
CUBLAS_WORKSPACE_CONFIG), ``save_tensors`` (path for logits and gradients, or null), ``workdir``
(where the real path writes its checkpoint). The result says how far the case got, what the plugin
recorded and read back, and any error with where it was raised. torch, megatron and TE are
imported inside functions only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.gpu import nemo_rl_host
from tests.gpu.runner_io import main

SETUP = "nemo_rl.models.megatron.setup"
WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"


def build_gpt_on_cuda(model_cfg, seed: int):
    """The stand-in's ``build_gpt`` on CUDA: TE layer spec unless ``transformer_impl == "local"``."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    from tests.fake_nemo_rl.cpu_megatron import ensure_model_parallel

    ensure_model_parallel()
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)  # Megatron's GPU weight init draws from its tracker
    model_cfg.use_cpu_initialization = False  # the stand-in initialises on CPU; a GPU worker does not
    local = model_cfg.transformer_impl == "local"
    spec = get_gpt_layer_local_spec() if local else get_gpt_layer_with_transformer_engine_spec()
    return GPTModel(
        config=model_cfg,
        transformer_layer_spec=spec,
        vocab_size=model_cfg.vocab_size,
        max_sequence_length=model_cfg.seq_length,
        position_embedding_type=model_cfg.position_embedding_type,
        rotary_base=model_cfg.rotary_base,
        rotary_percent=model_cfg.rotary_percent,
    ).cuda()


def forward_backward(model, vocab_size: int, batch: int, seq: int, seed: int):
    """Logits and mean next-token NLL of one forward on seeded random tokens, backward done.

    The loss is written with ``log_softmax`` and a one-hot product (no gather/scatter) so that
    every op has a deterministic CUDA backward."""
    import torch
    from megatron.core.transformer.module import Float16Module

    tokens = torch.randint(0, vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seed)).cuda()
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(seq, device="cuda").unsqueeze(0).expand(batch, -1)
    # The real worker's model is wrapped in Float16Module, which upcasts logits unless told not to.
    wrapped = isinstance(model, Float16Module) and "fp32_output" in inspect.signature(model.forward).parameters
    keep = {"fp32_output": False} if wrapped else {}
    logits = model(inputs, positions, attention_mask=None, **keep)  # [b, s, vocab]; TE/local build the causal mask
    target = torch.nn.functional.one_hot(labels, vocab_size).float()
    loss = -(logits.float().log_softmax(-1) * target).sum(-1).mean()
    loss.backward()
    torch.cuda.synchronize()
    return logits, loss


def _error(exc: BaseException, stage: str) -> dict[str, Any]:
    frames = [f.f_globals.get("__name__", "?") for f, _ in traceback.walk_tb(exc.__traceback__)]
    modules = list(dict.fromkeys(frames))
    return {
        "stage": stage,
        "type": type(exc).__name__,
        "message": str(exc)[:4000],
        "codes": [f.code for f in getattr(exc, "findings", [])],
        "raised_in": frames[-1] if frames else None,
        "modules": modules,
    }


def _te_state() -> dict[str, Any]:
    """Whether TE's DotProductAttention ever selected a backend in this process."""
    from nemo_rl_attn_align.hosts import te_readback

    dpa = sys.modules.get(te_readback.DPA_MODULE)
    state = getattr(dpa, "_attention_backends", None)
    return {
        "dpa_module_loaded": dpa is not None,
        "attention_params_set": bool(state and state.get("attention_params") is not None),
        "selections": [dict(s) for s in te_readback.selections],
    }


def _standin_worker(spec: dict[str, Any], seed: int) -> tuple[Any, Any, Callable[[], tuple[Any, Any]]]:
    """The stand-in layout's setup and worker modules, and a builder: its ``MegatronPolicyWorker``
    (model on CUDA) -> (model config, model)."""
    sys.path.insert(0, str(nemo_rl_host.STANDIN))
    setup = importlib.import_module(SETUP)
    setup.build_gpt = functools.partial(build_gpt_on_cuda, seed=seed)
    worker_module = importlib.import_module(WORKER)

    def build():
        worker = worker_module.MegatronPolicyWorker(spec["policy"])
        return worker.megatron_cfg.model, worker.model[0]

    return setup, worker_module, build


def _real_worker(spec: dict[str, Any], seed: int) -> tuple[Any, Any, Callable[[], tuple[Any, Any]]]:
    """The real NeMo-RL's setup and worker modules, and a builder: its worker path (``real_worker``)
    on a tiny checkpoint of the case's model -> (model config, model)."""
    from tests.gpu import real_worker

    worker_module = importlib.import_module(WORKER)
    setup = importlib.import_module(SETUP)

    def build():
        case = spec["policy"]
        checkpoint = real_worker.write_checkpoint(Path(spec["workdir"]) / "checkpoint", case["standin_model"])
        policy = real_worker.policy_config(real_worker.nemo_rl_tree(), checkpoint, real_worker.case_overrides(case))
        real_worker.setup_distributed(worker_module)
        runtime = real_worker.configure(worker_module, policy, checkpoint)
        runtime.megatron_cfg.rng.seed = seed  # Megatron seeds its weight init from it
        return runtime.megatron_cfg.model, real_worker.build(worker_module, policy, runtime)

    return setup, worker_module, build


def _train_step(result: dict[str, Any], spec: dict[str, Any], model: Any, seed: int) -> None:
    """One forward and backward; logits, loss and gradients into ``result``."""
    import torch
    from megatron.core.utils import get_attr_wrapped_model

    logits, loss = forward_backward(
        model, get_attr_wrapped_model(model, "vocab_size"), spec.get("batch", 2), spec.get("seq", 128), seed
    )
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    result["logits"] = {
        "shape": list(logits.shape),
        "dtype": str(logits.dtype),
        "finite": bool(torch.isfinite(logits).all()),
    }
    result["loss"] = float(loss)
    result["grads"] = {
        "count": len(grads),
        "params": sum(1 for _ in model.parameters()),
        "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
        "nonzero": sum(1 for g in grads.values() if bool(g.abs().sum() > 0)),
    }
    if spec.get("save_tensors"):
        torch.save(
            {"logits": logits.detach().cpu(), "grads": {n: g.detach().cpu() for n, g in grads.items()}},
            spec["save_tensors"],
        )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from nemo_rl_attn_align.contract.training import VERSIONED
    from nemo_rl_attn_align.hosts import bootstrap, megatron_worker
    from nemo_rl_attn_align.preflight.backend import NVTE_VARIABLES
    from nemo_rl_attn_align.vocab import host_versions as versions
    from nemo_rl_attn_align.vocab import patching as _patching

    seed = spec.get("seed", 1234)
    result: dict[str, Any] = {"plugin_active": bootstrap.activate("gpu-suite"), "bootstrap_origin": bootstrap.origin}
    if spec.get("deterministic"):
        torch.use_deterministic_algorithms(True)
    torch.cuda.set_device(0)
    result["device"] = {"name": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability())}
    result["versions"] = versions.library_versions(VERSIONED)
    host = nemo_rl_host.locate()
    result["nemo_rl"] = host.to_dict()
    setup, worker_module, build = (_real_worker if host.kind == "real" else _standin_worker)(spec, seed)
    result["seams_wrapped"] = sorted(
        f"{module.__name__}.{name}"
        for module, name in (
            (setup, "_apply_performance_config"),
            (worker_module, "validate_and_set_config"),
            (worker_module, "setup_model_and_optimizer"),
        )
        if _patching.is_wrapped(getattr(module, name))
    )
    stage, started = "setup", time.perf_counter()
    try:
        model_cfg, model = build()
        result["model_config"] = {
            "attention_backend": model_cfg.attention_backend.name,
            "deterministic_mode": model_cfg.deterministic_mode,
            "params_dtype": str(model_cfg.params_dtype),
        }
        result["nvte_after_build"] = {name: os.environ.get(name) for name in NVTE_VARIABLES}
        stage, built = "forward", time.perf_counter()
        _train_step(result, spec, model, seed)
        stage = "done"
        result["seconds"] = {"build": built - started, "forward_backward": time.perf_counter() - built}
    except Exception as exc:
        result["error"] = _error(exc, stage)
    result["stage"] = stage
    result["observed"] = megatron_worker.record.observed
    result["findings"] = list(megatron_worker.record.findings)
    result["te"] = _te_state()
    result["nvte_at_end"] = {name: os.environ.get(name) for name in NVTE_VARIABLES}
    return result


if __name__ == "__main__":
    sys.exit(main(run))
