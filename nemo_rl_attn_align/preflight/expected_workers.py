"""How many workers of each side a run will start, from its config alone (core, stdlib only).

The driver's report says "rollout: k of N workers recorded" and "training: k of N": a side whose
workers never wrote (a hook that did not attach, a worker class it did not cover) is then a
finding, never an empty pass. The counts follow NeMo-RL's placement in ``grpo.setup`` (read at
v0.6.0 and 7ea279a): one policy worker per GPU of the training cluster and one vLLM worker per GPU
of the generation cluster, which is the training cluster when ``policy.generation.colocated.enabled``,
else ``colocated.resources`` (``gpus_per_node`` on one node when ``cluster.num_nodes`` is 1, taken
from the training GPUs; else ``num_nodes`` whole nodes taken from the training nodes). vLLM groups
its workers by ``tensor_parallel_size * pipeline_parallel_size``; the policy's TP x PP x CP x DP is
its world. GPUs given to a reward-model environment are not subtracted (the count is then high and
the report lists the ids that did not write).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.config.loader import get_path
from nemo_rl_attn_align.vocab.worker_ids import megatron_generation_peers, rollout_peers, training_peers


@dataclass(frozen=True)
class ExpectedSide:
    """The workers one side should start: their ``count`` and ids (None: not derivable) and how."""

    count: int | None
    ids: tuple[str, ...]
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "ids": list(self.ids), "how": self.how}


def _positive(cfg: Mapping[str, Any], key: str) -> int | None:
    value = get_path(cfg, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _gpus(cfg: Mapping[str, Any]) -> tuple[int | None, int | None, str]:
    """GPUs of the training and of the generation cluster, and how they were derived."""
    nodes, per_node = _positive(cfg, "cluster.num_nodes"), _positive(cfg, "cluster.gpus_per_node")
    if nodes is None or per_node is None:
        return None, None, "cluster.num_nodes or cluster.gpus_per_node is not a positive integer"
    cluster = f"cluster {nodes} x {per_node} GPUs"
    if get_path(cfg, "policy.generation.colocated.enabled", True) is not False:
        return nodes * per_node, nodes * per_node, f"{cluster}, generation colocated"
    gen_per_node = _positive(cfg, "policy.generation.colocated.resources.gpus_per_node")
    gen_nodes = _positive(cfg, "policy.generation.colocated.resources.num_nodes") or 1
    if gen_per_node is None:
        return None, None, f"{cluster}, generation not colocated and colocated.resources.gpus_per_node unset"
    if nodes == 1:
        return per_node - gen_per_node, gen_per_node, f"{cluster}, {gen_per_node} GPUs for generation (not colocated)"
    return (
        (nodes - gen_nodes) * per_node,
        gen_nodes * gen_per_node,
        f"{cluster}, {gen_nodes} nodes for generation (not colocated)",
    )


def _megatron_generation(gen_gpus: int | None, how: str) -> ExpectedSide:
    """Megatron generation: one engine in every policy worker that generates (the training workers
    when colocated, else the dedicated inference policy's, one per generation GPU)."""
    if gen_gpus is None or gen_gpus < 1:
        return ExpectedSide(None, (), how)
    ids = tuple(megatron_generation_peers(gen_gpus))
    return ExpectedSide(len(ids), ids, f"{how}: {gen_gpus} Megatron generation engines (one per policy worker)")


def generation_gpus(cfg: Mapping[str, Any]) -> tuple[int | None, str]:
    """GPUs of the generation cluster (None: not derivable) and how they were derived."""
    _, gen_gpus, how = _gpus(cfg)
    return gen_gpus, how


def expected_workers(cfg: Mapping[str, Any], absent: Mapping[str, str] | None = None) -> dict[str, ExpectedSide]:
    """``training`` and ``rollout`` -> the workers the run should start; sides in ``absent`` (no
    such workers in this run) are left out."""
    absent = absent or {}

    train_gpus, gen_gpus, how = _gpus(cfg)
    out = {}
    if "training" not in absent:
        if train_gpus is None or train_gpus < 1:
            out["training"] = ExpectedSide(None, (), how)
        else:
            parallel = [
                f"{key}={_positive(cfg, f'policy.megatron_cfg.{key}') or 1}"
                for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
            ]
            out["training"] = ExpectedSide(
                train_gpus,
                tuple(training_peers(train_gpus)),
                f"{how}: {train_gpus} policy workers ({', '.join(parallel)}, DP the rest)",
            )
    if "rollout" not in absent and get_path(cfg, "policy.generation.backend", None) == "megatron":
        out["rollout"] = _megatron_generation(gen_gpus, how)
    elif "rollout" not in absent:
        tp = _positive(cfg, "policy.generation.vllm_cfg.tensor_parallel_size") or 1
        pp = _positive(cfg, "policy.generation.vllm_cfg.pipeline_parallel_size") or 1
        if gen_gpus is None or gen_gpus < 1:
            out["rollout"] = ExpectedSide(None, (), how)
        else:
            ids = tuple(rollout_peers(gen_gpus, tp * pp))
            out["rollout"] = ExpectedSide(
                len(ids), ids, f"{how}: {gen_gpus // (tp * pp)} vLLM engines x TP {tp} x PP {pp}"
            )
    return out
