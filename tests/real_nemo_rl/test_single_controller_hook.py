"""The driver hook on the real ``setup_single_controller`` (NeMo-RL 7ea279a), in one subprocess.

``examples/run_grpo_single_controller.py`` (NeMo-RL main) imports ``SingleControllerActor`` from
``nemo_rl.algorithms.single_controller`` and ``MasterConfig`` and ``setup_single_controller`` from the
package ``nemo_rl.algorithms.single_controller_utils`` (which re-exports it from its ``setup``
module), builds the pydantic ``MasterConfig`` from its recipe
(``grpo_math_1B_megatron_single_controller.yaml``) and calls ``setup_single_controller(config,
tokenizer)``. The subprocess does the same with the plugin's ``.pth`` active: the function the
example gets is the plugin's wrapper, the pre-flight rules stop a flash + FP32 config before the
real function runs, and with a config they pass the real function runs and the report's lifecycle
records its failure (``setup_failed``: no Ray cluster, no GPU here).
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
RECIPE = "examples/configs/grpo_math_1B_megatron_single_controller.yaml"
DRIVER = """
import inspect, json, os, sys
import attn_align_stand_ins
from nemo_rl.algorithms.single_controller import SingleControllerActor
from nemo_rl.algorithms.single_controller_utils import MasterConfig, setup_single_controller
import nemo_rl.algorithms.single_controller_utils.setup as setup_module
from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers
from omegaconf import OmegaConf
from nemo_rl_attn_align.vocab.errors import RuleViolation
from nemo_rl_attn_align.hosts import driver_report, handoff
from nemo_rl_attn_align.vocab import patching as _patching

register_omegaconf_resolvers()
original = _patching.original_of(setup_single_controller)
entered = []


def profile(frame, event, arg):
    if event == "call" and frame.f_code is original.__code__:
        entered.append(1)


sys.setprofile(profile)

def call(overrides):
    config = OmegaConf.to_container(parse_hydra_overrides(load_config(sys.argv[1]), overrides), resolve=True)
    master = MasterConfig(**config)  # as the example builds it
    os.environ.pop(handoff.SETTINGS_ENV, None)
    entered.clear()
    try:
        setup_single_controller(master, None)
        error = None
    except RuleViolation as err:
        error = {"rule_violation": [f.code for f in err.findings]}
    except Exception as err:
        error = {"type": type(err).__name__, "message": str(err)[:300]}
    report = driver_report.current
    return {
        "error": error,
        "original_entered": bool(entered),
        "settings_exported": handoff.SETTINGS_ENV in os.environ,
        "report_dir": report.settings.report_dir if report is not None else None,
    }

base = ["logger.log_dir=" + sys.argv[2], "policy.precision=bfloat16", "++policy.megatron_cfg.attention_backend=flash"]
out = {
    "wrapped": _patching.is_wrapped(setup_single_controller),
    "same_function": setup_single_controller is setup_module.setup_single_controller,
    "signature_kept": str(inspect.signature(setup_single_controller)) == str(inspect.signature(original)),
    "original_module": original.__module__,
    "flash_fp32": call(base + ["policy.precision=float32"]),
    "flash_bf16": call(base),
}
sys.setprofile(None)
print("SC_RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    tree = snapshot("7ea279a")
    logs = tmp_path_factory.mktemp("sc") / "logs"
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # a checkout under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(STAND_INS), *outer])}
    env = {k: v for k, v in env.items() if not k.startswith("NEMO_RL_ATTN_ALIGN")}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", DRIVER, str(tree / RECIPE), str(logs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("SC_RESULT ")]
    return {**json.loads(line.removeprefix("SC_RESULT ")), "logs": logs}


def test_the_examples_setup_single_controller_is_the_plugins_wrapper(seen):
    assert seen["wrapped"] and seen["same_function"] and seen["signature_kept"]
    assert seen["original_module"] == "nemo_rl.algorithms.single_controller_utils.setup"


def test_a_config_that_cannot_work_stops_before_the_real_setup_runs(seen):
    run = seen["flash_fp32"]
    assert run["error"] == {"rule_violation": ["FLASH_REQUIRES_HALF_PRECISION"]}
    assert not run["original_entered"] and not run["settings_exported"]


def test_a_config_that_passes_runs_the_real_setup_with_the_settings_exported_and_reported(seen):
    run = seen["flash_bf16"]
    assert run["original_entered"] and run["settings_exported"]
    assert run["error"] is not None and "rule_violation" not in run["error"]  # no Ray cluster, no GPU here
    report = json.loads((Path(run["report_dir"]) / "attention_align_report.json").read_text())
    assert report["collected_at"] == "setup_failed"
    assert Path(run["report_dir"]).is_relative_to(seen["logs"])
