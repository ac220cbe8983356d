"""vLLM generation worker hook: record what attention vLLM really runs, once its engine is up.

Two doors reach it in every vLLM process (the NeMo-RL generation actor, vLLM's engine core and,
with TP*PP > 1, vLLM's own Ray workers):

* the ``vllm.general_plugins`` entry point ``nemo_rl_attn_align = ...:register``, which vLLM's
  ``load_general_plugins()`` calls with no arguments once per process, wherever this package is
  installed in the worker's environment;
* the bootstrap's import hook (``.pth`` or the ``PYTHONPATH`` shim) for NeMo-RL's vLLM venv, which
  does not contain this package and so has no entry point for vLLM to find.

Both call ``attach()``, which wraps ``vllm.v1.worker.gpu_worker.Worker.compile_or_warm_up_model``:
it runs after the model is loaded and the KV cache is allocated, so the attention layers in
``vllm_config.compilation_config.static_forward_context`` carry the backend vLLM chose and
``VLLM_BATCH_INVARIANT``'s rewrites of the environment have happened.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from nemo_rl_attn_align.hosts import _patching, bootstrap, handoff
from nemo_rl_attn_align.hosts.worker_records import HostRecord, rollout_peers, rollout_worker_id, world_size

WORKER_MODULE = "vllm.v1.worker.gpu_worker"
TARGETS = (WORKER_MODULE,)
SUPPORTED = {"vllm": ">=0.11,<0.26 (NeMo-RL pins 0.11.2, 0.17.1, 0.20.0, 0.25.1)"}
SEAM = ("Worker", "compile_or_warm_up_model")


class RolloutRecord(HostRecord):
    """What one vLLM worker process saw."""

    host = "vllm_worker"

    def __init__(self, worker_id: str, facts: dict):
        super().__init__()
        self.worker_id = worker_id
        self.facts = facts

    def contract(self):
        from nemo_rl_attn_align.hosts.vllm_record import VERSIONED, rollout_contract

        return rollout_contract(self.facts, self.worker_id, _patching.library_versions(VERSIONED))

    def detail(self) -> dict[str, Any]:
        return {"vllm_config": self.facts}

    def peers(self) -> list[str]:
        parallel = (self.facts.get("tensor_parallel_size") or 1) * (self.facts.get("pipeline_parallel_size") or 1)
        return rollout_peers(world_size(), parallel)


#: The record of the engine in this process (None until one has warmed up).
record: RolloutRecord | None = None


def record_engine(worker: Any) -> RolloutRecord:
    """Read one warmed-up vLLM worker and write its record."""
    global record
    from nemo_rl_attn_align.determinism import probe
    from nemo_rl_attn_align.hosts.vllm_record import rollout_facts

    vllm_config = worker.vllm_config
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    facts = rollout_facts(vllm_config, context, os.environ)
    worker_id = rollout_worker_id(os.environ.get("RANK", "0"), getattr(worker, "rank", 0))
    record = RolloutRecord(worker_id, facts)
    record.probe = probe()
    requested = facts["requested_backend"]
    chosen = sorted(set(facts["layer_backends"].values()))
    if requested and chosen and chosen != [requested]:
        record.note(f"vLLM was asked for attention backend {requested} ({facts['requested_source']}) but chose {', '.join(chosen)}")
    record.write("engine_ready")
    record.stop_if_strict()
    return record


def _wrap_warm_up(original: Callable) -> Callable:
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        HostRecord.guarded("recording the vLLM engine", lambda: record_engine(self))
        return result

    return compile_or_warm_up_model


def _patch(module) -> None:
    cls = getattr(module, SEAM[0], None)
    if cls is None or not callable(getattr(cls, SEAM[1], None)):
        _patching.unsupported(
            "vLLM", _patching.host_version("vllm", "vllm"), f"{WORKER_MODULE}.{SEAM[0]}.{SEAM[1]} not found", handoff.worker_settings().strict
        )
        return
    _seams.wrap(cls, SEAM[1], _wrap_warm_up)


_seams = _patching.Seams(TARGETS, _patch)


def attach() -> None:
    """Record every vLLM engine that warms up in this process from now on (idempotent)."""
    _seams.attach()


def detach() -> None:
    """Restore vLLM's worker and stop watching."""
    _seams.detach()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it once per process; calling it again is harmless."""
    if bootstrap.enabled():
        attach()
