"""NeMo-RL's own tests of the Megatron seams give the same outcome per test with the plugin on and off.

For each ref with ``tests/unit/models/megatron/test_megatron_setup.py`` (7ea279a, v0.7.0, v0.6.0)
the file runs twice in subprocesses of this interpreter (the plugin installed in it, its ``.pth``
active), as the snapshots' README says it runs on CPU: ``--mcore-only -o addopts=""``, the source
tree on ``PYTHONPATH``, the stand-ins of ``stand_ins/attn_align_stand_ins.py`` loaded as a pytest
plugin; once with ``NEMO_RL_ATTN_ALIGN=0`` and once with ``=1``. Outcomes are compared per test id
(JUnit XML), and the "on" process is checked to have really wrapped ``_apply_performance_config``.
The line "plugin on: N passed = plugin off: N passed" is printed for each ref.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from .conftest import SEAM_TEST_REFS, snapshot

pytestmark = pytest.mark.real_nemo_rl

STAND_INS = Path(__file__).parent / "stand_ins"
SEAM_TESTS = "tests/unit/models/megatron/test_megatron_setup.py"


def _environment(tree: Path, plugin: str) -> dict[str, str]:
    env = dict(os.environ)
    outer = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]  # a checkout under test
    env.update(
        {
            "NEMO_RL_ATTN_ALIGN": plugin,
            "PYTHONPATH": os.pathsep.join([str(tree), str(STAND_INS), *outer]),
            # A fresh local Ray cluster for NeMo-RL's session fixture, never one another process started.
            "RAY_ADDRESS": "local",
        }
    )
    env.pop("ATTN_ALIGN_TEST_REQUIRE_REAL", None)  # NeMo-RL's own skips are its business
    return env


def _outcomes(tree: Path, plugin: str, junit: Path) -> dict[str, str]:
    """Test id -> passed/failed/error/skipped for one run of NeMo-RL's seam tests."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "attn_align_stand_ins",
            "-p",
            "no:cacheprovider",
            "--mcore-only",
            "-o",
            "addopts=",
            "-q",
            f"--junitxml={junit}",
            SEAM_TESTS,
        ],
        cwd=tree,
        env=_environment(tree, plugin),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert junit.is_file(), (
        f"NeMo-RL's tests did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes


def _seam_wrapped(tree: Path, plugin: str) -> bool:
    code = (
        "import attn_align_stand_ins, nemo_rl.models.megatron.setup as setup\n"
        "from nemo_rl_attn_align.vocab.patching import is_wrapped\n"
        "print(is_wrapped(setup._apply_performance_config))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=_environment(tree, plugin),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("ref", SEAM_TEST_REFS)
def test_nemo_rl_seam_tests_same_with_plugin_on_and_off(ref, tmp_path, capsys):
    tree = snapshot(ref)
    assert _seam_wrapped(tree, "1") and not _seam_wrapped(tree, "0"), "the plugin's switch did not take effect"
    off = _outcomes(tree, "0", tmp_path / "off.xml")
    on = _outcomes(tree, "1", tmp_path / "on.xml")
    counts_on, counts_off = Counter(on.values()), Counter(off.values())
    with capsys.disabled():
        print(
            f"\nNeMo-RL {ref} {SEAM_TESTS}: plugin on: {counts_on['passed']} passed = plugin off: "
            f"{counts_off['passed']} passed (on {dict(counts_on)}, off {dict(counts_off)})"
        )
    assert off, "no test ran"
    differing = sorted(test for test in on.keys() | off.keys() if on.get(test) != off.get(test))
    assert not differing, "\n".join(f"{t}: on {on.get(t)}, off {off.get(t)}" for t in differing[:30])
