"""Stand-in for ``nemo_rl/algorithms/grpo.py``: ``setup(master_config, tokenizer, dataset, val_dataset, ...)``
is where NeMo-RL builds its Ray worker groups, each copying ``os.environ`` into every actor."""

import os


def setup(master_config, tokenizer, dataset, val_dataset, processor=None, policy_factory=None):
    return {"worker_env": dict(os.environ)}  # what RayWorkerGroup would hand every actor
