"""Worker ids, as the worker files are named and the report lists them (stdlib only, imports nothing).

``policy-rank{RANK}`` for a Megatron policy worker, ``vllm-rank{RANK}-worker{n}`` for vLLM worker
``n`` of the engine that NeMo-RL's generation actor ``RANK`` started. The hooks name their own
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


def training_peers(world_size: int) -> list[str]:
    """Every policy worker of a group of ``world_size``."""
    return [training_worker_id(rank) for rank in range(world_size)]


def rollout_peers(world_size: int, model_parallel: int) -> list[str]:
    """Every vLLM worker of a generation group of ``world_size`` GPUs: NeMo-RL ties them in groups
    of ``model_parallel`` (TP x PP); the first actor of each group starts the engine, whose vLLM
    workers are numbered 0..model_parallel-1."""
    step = max(model_parallel, 1)
    return [rollout_worker_id(leader, n) for leader in range(0, world_size, step) for n in range(step)]
