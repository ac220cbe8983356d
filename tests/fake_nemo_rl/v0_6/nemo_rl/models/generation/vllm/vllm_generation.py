"""Stand-in for ``nemo_rl/models/generation/vllm/vllm_generation.py``: ``VllmGeneration``.

As upstream: one worker group with ``vllm_cfg.env_vars`` on top of the driver's environment, then
``_post_init()`` blocks on every worker (their engines are up when the constructor returns).
"""

import ray

from nemo_rl.distributed.worker_groups import RayWorkerGroup

WORKER = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"  # upstream: a string FQN too


class VllmGeneration:
    def __init__(self, cluster, config, name_prefix="vllm_policy"):
        self.worker_group = RayWorkerGroup(
            cluster, WORKER, config, name_prefix=name_prefix, env_vars=config["vllm_cfg"].get("env_vars")
        )
        self._post_init()

    def _post_init(self):
        futures = self.worker_group.run_all_workers_single_data("post_init")
        return ray.get(futures) if futures else []
