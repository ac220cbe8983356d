"""The table of the engine arguments NeMo-RL's vLLM worker passes itself
(``preflight/tables/vllm_worker_kwargs.json``) is what each ref's own source says today: regenerated
from the snapshots by ``scripts/update_vllm_worker_kwargs.py --check``, which fails while it differs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_nemo_rl.conftest import REFS, snapshot

pytestmark = pytest.mark.real_nemo_rl

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_table_is_what_every_refs_worker_source_says():
    trees = [snapshot(ref) for ref in REFS]  # skips outside the lane or without the snapshots
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "update_vllm_worker_kwargs.py"),
            str(trees[0].parent),
            *REFS,
            "--check",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "vllm_worker_kwargs.json is current" in done.stdout
