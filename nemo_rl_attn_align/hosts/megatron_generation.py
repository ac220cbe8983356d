"""Megatron generation hook: record the rollout contract of megatron-core's inference engine.

Seam (NVIDIA-NeMo/RL 7ea279a, ``policy.generation.backend: megatron``):
``nemo_rl.models.generation.megatron.megatron_worker.MegatronGenerationMixin._initialize_inference_engine(
self, mcore_generation_config)``, which every ``MegatronPolicyWorker`` inherits and calls once, on the
first ``prepare_for_generation``. After it, ``self.inference_context`` is the
``DynamicInferenceContext`` the engine runs and ``self._gen_model`` the model it wraps (the
training model, or the dedicated inference-layout one): the rollout record is written from them
(``contract.megatron_generation_contract``), with the determinism probe of this process.

The same worker trains (colocated) or belongs to a dedicated inference ``Policy`` (not colocated,
``megatron_cfg`` merged with ``mcore_generation_config``): there the Megatron worker hook writes no
training record (``is_generation_only``), so the training side holds the trainers alone.

A NeMo-RL without the seam gets one warning naming it (strict mode: an error) and runs untouched.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.hosts.seams import Seam
from nemo_rl_attn_align.hosts.worker_records import HostRecord, guarded_step, world_size
from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab.worker_ids import megatron_generation_peers, megatron_generation_worker_id

if TYPE_CHECKING:
    from nemo_rl_attn_align.contract.megatron_snapshot import InferenceSnapshot

#: Keys only ``mcore_generation_config`` has (``MCoreGenerationSpecificArgs``): found in a worker's
#: ``megatron_cfg``, they say NeMo-RL merged the generation config over it (a dedicated inference policy).
GENERATION_ONLY_KEYS = ("buffer_size_gb", "block_size_tokens", "kv_cache_management_mode")

log = logging.getLogger("nemo_rl_attn_align")


def is_generation_only(policy_cfg: Mapping[str, Any]) -> bool:
    """Whether a policy worker with this config only generates: NeMo-RL's non-colocated Megatron
    generation builds its ``Policy`` from ``merged_inference_megatron_cfg`` (the generation keys
    merged into ``megatron_cfg``); a training policy's ``megatron_cfg`` has none of them."""
    generation = policy_cfg.get("generation")
    megatron_cfg = policy_cfg.get("megatron_cfg")
    if not isinstance(generation, Mapping) or not isinstance(megatron_cfg, Mapping):
        return False
    return generation.get("backend") == "megatron" and all(key in megatron_cfg for key in GENERATION_ONLY_KEYS)


class GenerationRecord(HostRecord):
    """The Megatron generation engine of this policy worker."""

    host = "megatron_generation"

    def __init__(self, rank: int, snapshot: InferenceSnapshot):
        super().__init__()
        self.rank, self.snapshot = rank, snapshot

    @property
    def worker_id(self) -> str:
        return megatron_generation_worker_id(self.rank)

    def peers(self) -> list[str]:
        return megatron_generation_peers(world_size())

    def contract(self):
        from nemo_rl_attn_align.contract.megatron_generation_contract import VERSIONED, megatron_inference_contract

        return megatron_inference_contract(self.snapshot, self.worker_id, versions.library_versions(VERSIONED))

    def detail(self) -> dict[str, Any]:
        return {"nemo_rl": versions.installed_version("NeMo-RL"), "inference_engine": self.snapshot.to_dict()}


#: The record of this worker's engine (None until the engine is initialized).
record: GenerationRecord | None = None


def flash_available() -> dict[str, bool | None]:
    """Which flash-attn generations megatron-core's attention module found at import: its module
    globals ``HAVE_FA3`` / ``HAVE_FA4``, and flash-attn 2's ``flash_attn_varlen_func`` (None when not
    installed); None where the module or the name is not there."""
    attention = sys.modules.get("megatron.core.transformer.attention")
    found: dict[str, bool | None] = {key: getattr(attention, f"HAVE_{key.upper()}", None) for key in ("fa3", "fa4")}
    found["fa2"] = None if attention is None else getattr(attention, "flash_attn_varlen_func", None) is not None
    return found


def _unwrapped(model: Any) -> Any:
    """The module under DDP/Float16 wrappers (``.module`` chain) and a virtual-pipeline list."""
    if isinstance(model, (list, tuple)):
        model = model[0] if model else None
    for _ in range(8):
        inner = getattr(model, "module", None)
        if inner is None:
            break
        model = inner
    return model


def record_engine(worker: Any) -> GenerationRecord:
    """Read the inference engine ``worker`` has just initialized and write its record."""
    global record
    from nemo_rl_attn_align.binding.determinism import probe
    from nemo_rl_attn_align.contract.megatron_snapshot import read_inference

    gen_model = getattr(worker, "_gen_model", None)  # a method: the model the engine wraps
    model = _unwrapped(gen_model() if callable(gen_model) else getattr(worker, "model", None))
    policy_cfg = getattr(worker, "cfg", None)
    snapshot = read_inference(
        getattr(model, "config", None),
        getattr(worker, "inference_context", None),
        flash_available(),
        policy_cfg if isinstance(policy_cfg, Mapping) else None,
        getattr(worker, "is_generation_colocated", None),
    )
    rank = getattr(worker, "rank", None)
    record = GenerationRecord(rank if isinstance(rank, int) else int(os.environ.get("RANK", "0") or 0), snapshot)
    record.probe = probe()
    record.write("engine_ready")
    record.stop_if_strict()
    return record


def _wrap_initialize(original: Callable, seam: Seam) -> Callable:
    def _initialize_inference_engine(self, mcore_generation_config, *args, **kwargs):
        already = getattr(self, "_inference_engine_initialized", False)
        result = original(self, mcore_generation_config, *args, **kwargs)
        if not already:
            guarded_step("recording the Megatron generation engine", lambda: record_engine(self))
        return result

    return _initialize_inference_engine


_seams = hooks.Hook("megatron_generation")
#: Wrap the generation seam now or when its module is imported (idempotent); restore it, stop watching.
attach, detach = _seams.attach, _seams.detach
