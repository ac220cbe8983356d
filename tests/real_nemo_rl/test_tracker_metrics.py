"""The report's numbers reach the user's tracker through NeMo-RL's real ``Logger`` (ref 7ea279a):
a driver process (the plugin's ``.pth`` active, so ``Logger.log_metrics`` is wrapped on import)
prepares a run, logs three GRPO-shaped steps through the real ``Logger`` with its TensorBoard
backend, and the event files are read back with TensorBoard's own ``EventAccumulator``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import snapshot

pytestmark = pytest.mark.real_nemo_rl

STAND_INS = Path(__file__).parent / "stand_ins"
DRIVER = """
import json, os, sys
import attn_align_stand_ins
from nemo_rl.utils.logger import Logger
from nemo_rl_attn_align.hosts import driver_report, nemo_rl_driver

log_dir = sys.argv[1]
cfg = {
    "policy": {"precision": "bfloat16", "megatron_cfg": {"enabled": False}},
    "logger": {"log_dir": log_dir},
    "attention_align": {"on_mismatch": "record", "attention_estimate": False},
}
run = nemo_rl_driver.prepare(cfg, "grpo")
run.at_setup()
logger = Logger({
    "log_dir": log_dir, "wandb_enabled": False, "swanlab_enabled": False, "mlflow_enabled": False,
    "tensorboard_enabled": True, "tensorboard": {}, "monitor_gpus": False,
})
for step in (1, 2, 3):  # as grpo_train logs a step: train metrics, then timing with step_finished
    logger.log_metrics({"loss": 0.5, "token_mult_prob_error": 1.0 + step / 64}, step, prefix="train")
    logger.log_metrics({"total_step_time": 1.0}, step, prefix="timing/train", step_finished=True)
driver_report.end_of_training()
for backend in logger.loggers:
    backend.writer.flush()
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(os.path.join(log_dir, "tensorboard"))
events.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}))
"""


def test_attention_align_scalars_are_in_tensorboard_event_files_of_the_real_logger(tmp_path):
    tree = snapshot("7ea279a")
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(STAND_INS), *outer])}
    env = {k: v for k, v in env.items() if not k.startswith("NEMO_RL_ATTN_ALIGN")}
    log_dir = tmp_path / "logs" / "exp_001"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", DRIVER, str(log_dir)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [step for step, _ in scalars["train/token_mult_prob_error"]] == [1, 2, 3]  # NeMo-RL's own, untouched
    report = json.loads((log_dir / "attention_align" / "attention_align_report.json").read_text())
    verdict = {"pass": 1.0, "incomparable": 0.0, "fail": -1.0}[report["verdict"]]
    assert scalars["attention_align/verdict"] == [[1, verdict], [2, verdict], [3, verdict]]
    assert [step for step, _ in scalars["attention_align/readback_workers"]] == [1, 2, 3]
    assert not any(tag.startswith("attention_align/attention_only") for tag in scalars)  # estimate turned off
    assert [s["step"] for s in report["drift"]["steps"]] == [1, 2, 3]
