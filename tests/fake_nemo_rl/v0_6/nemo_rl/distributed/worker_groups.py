"""Stand-in for ``nemo_rl/distributed/worker_groups.py``: ``RayWorkerGroup``.

As upstream (``_create_workers_from_bundle_indices``): the worker class is named by its FQN, the
group's ``env_vars`` are filled with every variable of the driver's ``os.environ`` *at creation time*
(inside the algorithm's ``setup()``), then each worker gets ``RANK`` and ``WORLD_SIZE``; one Ray actor
per worker. Upstream imports the class in an ``IsolatedWorkerInitializer`` actor; the stand-in
imports it here, only for a non-empty group (that changes nothing a worker sees). ``MASTER_PORT`` is
left out: each stand-in worker is its own world-size-1 gloo group (``cpu_megatron``).

Upstream runs each worker class in its own venv (``ACTOR_ENVIRONMENT_REGISTRY`` -> ``py_executable``,
a uv venv without the driver's pip-installed packages). Here every group runs in the driver's
interpreter unless ``STANDIN_PY_EXECUTABLES`` (JSON: worker FQN -> python) names another one.
"""

import importlib
import json
import os

import ray


class RayWorkerGroup:
    def __init__(self, cluster, worker_fqn, *worker_args, name_prefix="", env_vars=None, **worker_kwargs):
        env_vars = dict(env_vars or {})
        for key, value in os.environ.items():
            if key not in env_vars:
                env_vars[key] = value
        self.env_vars = env_vars  # what every actor of this group gets
        self.world_size = cluster.world_size()
        self.workers = []
        if self.world_size:
            module, name = worker_fqn.rsplit(".", 1)
            actor_cls = ray.remote(num_cpus=0)(getattr(importlib.import_module(module), name))
            python = json.loads(os.environ.get("STANDIN_PY_EXECUTABLES", "{}")).get(worker_fqn)
            venv = {"py_executable": python} if python else {}
            self.workers = [
                actor_cls.options(
                    runtime_env={
                        "env_vars": {**env_vars, "RANK": str(rank), "WORLD_SIZE": str(self.world_size)},
                        **venv,
                    }
                ).remote(*worker_args, **worker_kwargs)
                for rank in range(self.world_size)
            ]

    def run_all_workers_single_data(self, method_name, *args, **kwargs):
        return [getattr(worker, method_name).remote(*args, **kwargs) for worker in self.workers]
