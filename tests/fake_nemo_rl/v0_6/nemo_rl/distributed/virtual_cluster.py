"""Stand-in for ``nemo_rl/distributed/virtual_cluster.py``: ``init_ray()`` and the cluster's size.

As upstream (v0.6.0), ``init_ray`` joins a running cluster when there is one (the tests start one
and pass ``RAY_ADDRESS``) and gives the job ``runtime_env={"env_vars": dict(os.environ)}``: the
driver's environment *at this moment*, before the algorithm's ``setup()`` runs.
"""

import os

import ray


class RayVirtualCluster:
    """How many workers (NeMo-RL: GPUs) a worker group gets."""

    def __init__(self, num_nodes, gpus_per_node):
        self.num_nodes, self.num_gpus_per_node = num_nodes, gpus_per_node

    def world_size(self):
        return self.num_nodes * self.num_gpus_per_node


def init_ray():
    env_vars = dict(os.environ)
    env_vars.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
    ray.init(address=os.environ.get("RAY_ADDRESS"), runtime_env={"env_vars": env_vars}, log_to_driver=False)
