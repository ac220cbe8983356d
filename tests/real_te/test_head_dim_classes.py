"""The training table holds one representative per class of head dims: every sampled pair of a class
gets its representative's answer from TE's real selector, at every TE version the table holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_te

REPO = Path(__file__).resolve().parents[2]
TE_PATHS = [p for p in os.environ.get("ATTN_ALIGN_TEST_TE_PATHS", "").split(os.pathsep) if p]


@pytest.mark.parametrize("te_path", [None, *TE_PATHS])
def test_every_head_dim_of_a_class_gets_its_representatives_answer(te_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (te_path, str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tests.real_te.head_dim_classes"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
