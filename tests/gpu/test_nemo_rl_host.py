"""Which NeMo-RL the GPU suite drives (``nemo_rl_host.locate``), checked on CPU on every machine (not ``mcore``).

The stand-in branch is what every machine without NeMo-RL takes; the real branch is exercised here
with a package folder made on the spot, and against the real NeMo-RL snapshots in the lane
(``tests/real_nemo_rl/test_real_worker_path.py``), where the real branch's CPU part also runs.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.gpu.nemo_rl_host import REPO, STANDIN, locate


def _package(root, name="nemo_rl", init=True):
    folder = root / name
    folder.mkdir(parents=True)
    if init:
        (folder / "__init__.py").write_text("")
    return folder


def test_without_nemo_rl_the_stand_in_layout_is_used():
    host = locate([])
    assert (host.kind, host.location) == ("stand-in", "tests/fake_nemo_rl/v0_6")
    assert (
        host.line() == "mcore suite: stand-in NeMo-RL layout tests/fake_nemo_rl/v0_6 (NeMo-RL is not importable here)"
    )


def test_the_stand_in_on_sys_path_does_not_count_as_nemo_rl():
    assert (STANDIN / "nemo_rl" / "__init__.py").is_file()  # it is a package that would be found
    assert locate([str(STANDIN), str(STANDIN.parent)]).kind == "stand-in"


def test_an_importable_nemo_rl_is_driven(tmp_path):
    package = _package(tmp_path / "checkout")
    host = locate([str(tmp_path / "elsewhere"), str(tmp_path / "checkout"), str(STANDIN)])
    assert (host.kind, host.location, host.version) == ("real", str(package), None)
    assert host.line() == f"mcore suite: real NeMo-RL worker path (nemo_rl version unknown at {package})"


def test_a_bare_folder_named_nemo_rl_is_not_a_nemo_rl(tmp_path):
    _package(tmp_path, init=False)
    assert locate([str(tmp_path)]).kind == "stand-in"


def test_the_suite_summary_says_which_nemo_rl_it_drives(tmp_path):
    package = _package(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "mcore",
            "--collect-only",
            "tests/gpu/test_backends.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert f"mcore suite: real NeMo-RL worker path (nemo_rl version unknown at {package})" in proc.stdout, proc.stdout[
        -2000:
    ]
