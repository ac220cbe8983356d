"""The committed training kernel table is what TE's own selector answers today, at every TE version it holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.kernels import kernel_table

pytestmark = pytest.mark.real_te

REPO = Path(__file__).resolve().parents[2]


def test_committed_table_equals_te_selectors():
    """Regenerates the table from the installed TE and each ``ATTN_ALIGN_TEST_TE_PATHS`` folder (another
    TE wheel installed with --target); fails when any answer, reason or header differs."""
    paths = [p for p in os.environ.get("ATTN_ALIGN_TEST_TE_PATHS", "").split(os.pathsep) if p]
    if not paths:
        pytest.skip("ATTN_ALIGN_TEST_TE_PATHS names no second TE version (.ci/lanes/te.sh sets it)")
    te_paths = [arg for path in paths for arg in ("--te-path", path)]
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "update_kernel_tables.py"), "training", "--check", *te_paths],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    current = {line.split(" is current")[0] for line in done.stdout.splitlines() if line.endswith(" is current")}
    # every committed version was regenerated and equals its selector's answers (none left stale or unchecked)
    assert current == {kernel_table.path("training", v).name for v in kernel_table.versions("training")}, done.stdout
