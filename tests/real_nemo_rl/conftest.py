"""The real NeMo-RL sources, for the tests of lane ``.ci/lanes/nemo_rl.sh`` (marker ``real_nemo_rl``).

``ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS`` names a folder holding unmodified NeMo-RL source trees, one
folder per ref (``7ea279a``, ``v0.7.0``, ``v0.6.0``, ``v0.5.0``); ``.ci/run`` sets it when CI
laid the snapshots beside the clone. Without it, or outside the lane (``ATTN_ALIGN_TEST_LANE``),
every test here skips with one line (in a lane,
``ATTN_ALIGN_TEST_REQUIRE_REAL=1`` turns that skip into a failure). Nothing from the trees is copied.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SNAPSHOTS_VARIABLE = "ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS"
#: Set to ``nemo_rl`` by ``.ci/lanes/nemo_rl.sh``, whose venv has what these tests need (Python 3.13,
#: megatron-core 0.19.2, megatron-bridge, ...); elsewhere (the base lane) they skip.
LANE_VARIABLE = "ATTN_ALIGN_TEST_LANE"
#: Every ref the lane covers, newest first; the megatron seam tests exist from v0.6.0 on.
REFS = ("7ea279a", "v0.7.0", "v0.6.0", "v0.5.0")
SEAM_TEST_REFS = ("7ea279a", "v0.7.0", "v0.6.0")
#: Refs whose pydantic ``MasterConfig`` the shipped examples must pass.
VALIDATION_REFS = ("7ea279a", "v0.7.0")


def snapshots_root() -> Path | None:
    """The folder named by ``ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS``, or None when unset or absent."""
    value = os.environ.get(SNAPSHOTS_VARIABLE)
    return Path(value) if value and Path(value).is_dir() else None


def snapshot(ref: str) -> Path:
    """The source tree of ``ref``; skips the calling test (one line) when it is not available."""
    if os.environ.get(LANE_VARIABLE) != "nemo_rl":
        pytest.skip(
            f"runs in lane .ci/lanes/nemo_rl.sh ({LANE_VARIABLE}=nemo_rl), "
            "whose venv has the real NeMo-RL's dependencies"
        )
    root = snapshots_root()
    if root is None:
        pytest.skip(f"{SNAPSHOTS_VARIABLE} is not set to the NeMo-RL snapshots folder (.ci/run sets it)")
    tree = root / ref
    if not (tree / "nemo_rl").is_dir():
        pytest.skip(f"{tree} holds no NeMo-RL source tree")
    return tree


def check_recipe(recipe: str, *args: str) -> tuple[dict, str]:
    """``check`` on ``recipe`` (a path in NeMo-RL 7ea279a's tree, read unmodified) with ``args``, as a
    user runs it: the ``--json`` document and the text, their exit codes agreeing."""
    command = [sys.executable, "-m", "nemo_rl_attn_align", "check", str(snapshot("7ea279a") / recipe), *args]
    text = subprocess.run(command, capture_output=True, text=True, timeout=120)
    doc = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120)
    result = json.loads(doc.stdout)
    assert result["exit_code"] == doc.returncode == text.returncode, doc.stderr[-2000:]
    return result, text.stdout


def load_source_module(tree: Path, relative: str, name: str):
    """Import one file of a source tree as module ``name`` (for files that import only libraries,
    so several refs can be loaded side by side in one process)."""
    spec = importlib.util.spec_from_file_location(name, tree / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_check(script: str, *args: str, timeout: int) -> str:
    """Run ``scripts/<script> ARGS --check`` (a table script) in this interpreter from the repository
    root; fails the test unless it exits 0 (the committed table is current). Its stdout."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(repo / "scripts" / script), *args, "--check"],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout
