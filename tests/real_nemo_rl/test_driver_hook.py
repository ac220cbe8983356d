"""The driver hook against the real NeMo-RL driver module, in one subprocess (ref 7ea279a).

``examples/run_grpo.py`` imports ``nemo_rl.algorithms.grpo`` at its top; only later does ``main()``
call ``init_ray()``, which copies ``os.environ`` into the job's ``runtime_env``. The subprocess is a
driver as a user starts it (this interpreter, the plugin's ``.pth`` active, the source tree and the
stand-ins on ``PYTHONPATH``): before the import the shim is not on ``PYTHONPATH``, after it the shim
is first and the real ``setup``, ``grpo_train`` and ``Logger.log_metrics`` are wrapped.
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
import json, os
before = os.environ.get("PYTHONPATH", "").split(os.pathsep)
import attn_align_stand_ins
import nemo_rl.algorithms.grpo as grpo  # examples/run_grpo.py, at its top
from nemo_rl.utils.logger import Logger
from nemo_rl_attn_align.hosts import bootstrap
from nemo_rl_attn_align.vocab import patching as _patching
print(json.dumps({
    "origin": bootstrap.origin, "shim": bootstrap.SHIM_DIR, "before": before,
    "after": os.environ.get("PYTHONPATH", "").split(os.pathsep),
    "wrapped": [_patching.is_wrapped(f) for f in (grpo.setup, grpo.grpo_train, Logger.log_metrics)],
}))
"""


def test_importing_the_real_grpo_module_exports_the_shim_and_wraps_the_seams():
    tree = snapshot("7ea279a")
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # a checkout under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(STAND_INS), *outer])}
    env = {k: v for k, v in env.items() if not k.startswith("NEMO_RL_ATTN_ALIGN")}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", DRIVER], cwd=tree, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["origin"] == "pth"
    assert seen["shim"] not in seen["before"]  # the .pth exported nothing
    assert seen["after"][0] == seen["shim"] and seen["after"][1:] == [p for p in seen["before"] if p]
    assert seen["wrapped"] == [True, True, True]
