"""No tracked file points at a file outside the repository.

Comments and docs cite the upstream source itself (project, file, commit or tag). The one exception
is ``.ci/run``: CI lays the shared host data beside the clone, and ``.ci/run`` turns that folder into
``ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS``, the only way the tests get the snapshot path.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

OUTSIDE = (b"design" + b".md", b"../" + b"shared")  # spelled apart so this file does not match itself
EXEMPT = {".ci/run"}


def tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def test_no_tracked_file_references_files_outside_the_repository():
    files = tracked_files()
    assert "README.md" in files and "nemo_rl_attn_align/binding/determinism.py" in files
    found = []
    for name in files:
        path = REPO / name
        if name in EXEMPT or not path.is_file():
            continue
        data = path.read_bytes()
        found += [f"{name}: {pattern.decode()}" for pattern in OUTSIDE if pattern in data]
    assert found == []


def test_the_exemption_is_still_needed():
    """``.ci/run`` still reads the data beside the clone (else the exemption goes)."""
    assert OUTSIDE[1] in Path(REPO, ".ci", "run").read_bytes()
