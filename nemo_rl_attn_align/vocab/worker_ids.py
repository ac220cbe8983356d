"""Worker ids, as the worker files are named and the report lists them (stdlib only, imports nothing).

``policy-rank{RANK}`` for a Megatron policy worker, ``vllm-rank{RANK}-worker{n}`` for vLLM worker
``n`` of the engine that NeMo-RL's generation actor ``RANK`` started (``-engine<k>`` appended for
the ``k``-th later engine recorded under the same id in one run). The hooks name their own
files with them, and the driver derives from the config every id a run should produce
(``preflight.expected_workers``), so a missing worker is a named gap.
"""

from __future__ import annotations


def training_worker_id(rank: int) -> str:
    """Id of the Megatron policy worker with NeMo-RL ``RANK`` ``rank``."""
    return f"policy-rank{rank}"


def rollout_worker_id(rank: int | str, engine_rank: int) -> str:
    """Id of vLLM worker ``engine_rank`` of the engine started by NeMo-RL's generation actor ``rank``."""
    return f"vllm-rank{rank}-worker{engine_rank}"


def engine_worker_id(worker_id: str, engine: int) -> str:
    """Id of the ``engine``-th engine (0-based) that recorded under ``worker_id`` in one run: the
    first keeps ``worker_id``, a later one (a second engine started in the same process, or an
    actor restarted with the same ``RANK``) is ``<worker_id>-engine<engine>``, so no record replaces another."""
    return f"{worker_id}-engine{engine}" if engine > 0 else worker_id


def training_peers(world_size: int) -> list[str]:
    """Every policy worker of a group of ``world_size``."""
    return [training_worker_id(rank) for rank in range(world_size)]


def rollout_peers(world_size: int, model_parallel: int, engine: int = 0) -> list[str]:
    """Every vLLM worker of a generation group of ``world_size`` GPUs: NeMo-RL ties them in groups
    of ``model_parallel`` (TP x PP); the first actor of each group starts the engine, whose vLLM
    workers are numbered 0..model_parallel-1 (``engine``: the ids of the group's ``engine``-th engine)."""
    step = max(model_parallel, 1)
    return [
        engine_worker_id(rollout_worker_id(leader, n), engine)
        for leader in range(0, world_size, step)
        for n in range(step)
    ]


def megatron_generation_worker_id(rank: int) -> str:
    """Id of the Megatron generation engine in the policy worker with NeMo-RL ``RANK`` ``rank``."""
    return f"megatron-gen-rank{rank}"


def megatron_generation_peers(world_size: int) -> list[str]:
    """Every Megatron generation engine of a policy group of ``world_size`` (one per worker)."""
    return [megatron_generation_worker_id(rank) for rank in range(world_size)]
