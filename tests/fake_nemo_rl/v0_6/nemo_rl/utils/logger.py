"""Stand-in for ``nemo_rl/utils/logger.py``: ``get_next_experiment_dir`` and ``Logger.log_metrics``.

Same names and signatures as upstream (v0.6.0); the logger writes each call as one JSON line to
``<log_dir>/metrics.jsonl`` instead of TensorBoard/W&B.
"""

import glob
import json
import os
import re


def get_next_experiment_dir(base_log_dir):
    pattern = re.compile(r"exp_(\d+)")
    ids = [int(m.group(1)) for d in glob.glob(os.path.join(base_log_dir, "exp_*")) if (m := pattern.search(d))]
    new_log_dir = os.path.join(base_log_dir, f"exp_{max(ids, default=0) + 1:03d}")
    os.makedirs(new_log_dir, exist_ok=True)
    return new_log_dir


class Logger:
    def __init__(self, cfg):
        self.base_log_dir = cfg["log_dir"]
        os.makedirs(self.base_log_dir, exist_ok=True)

    def log_metrics(self, metrics, step, prefix="", step_metric=None, step_finished=False):
        with open(os.path.join(self.base_log_dir, "metrics.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "prefix": prefix, "metrics": metrics}) + "\n")
