"""Stand-in for ``nemo_rl/models/policy/lm_policy.py``: ``Policy`` over a group of Megatron workers."""

import ray

from nemo_rl.distributed.worker_groups import RayWorkerGroup

WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"  # upstream: a string FQN too


class Policy:
    def __init__(self, cluster, config, tokenizer=None, name_prefix="lm_policy"):
        self.worker_group = RayWorkerGroup(
            cluster, WORKER, config, name_prefix=name_prefix, env_vars=config["megatron_cfg"].get("env_vars")
        )

    def print_node_ip_and_gpu_id(self):
        """Upstream: blocks on every worker (so their constructors have finished) and prints a table."""
        futures = self.worker_group.run_all_workers_single_data("report_node_ip_and_gpu_id")
        results = ray.get(futures) if futures else []
        print(f"policy workers: {results}")
        return results

    def get_logprobs(self):
        return ray.get(self.worker_group.run_all_workers_single_data("get_logprobs"))
