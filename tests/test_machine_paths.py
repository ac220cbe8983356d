"""No machine path in ``.ci/``, ``tests/`` or the package, and one name per lane interpreter.

The lanes find their interpreters by name (``.ci/python.sh``: ``python3.X`` on PATH, pyenv, uv) or
from one variable per version, ``ATTN_ALIGN_CI_PYTHON3XX``; nothing assumes one machine's layout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

#: Home and work folders of particular machines (spelled apart so this file does not match itself).
MACHINE_PATHS = ("/ro" + "ot", "/ho" + "me/", "/wo" + "rk/")
SCANNED = (".ci", "tests", "nemo_rl_attn_align")
#: An interpreter variable as the lanes, tests and README spell one (``..._PYTHON313``).
LANE_VARIABLE = re.compile(r"ATTN_ALIGN_\w*?PYTHON\d+(?!\w)")


def text_files():
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".gz"}:
                yield path


def test_no_machine_path_in_ci_tests_or_the_package():
    found = []
    for path in text_files():
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}: {p}" for p in MACHINE_PATHS if p in text]
    assert found == []


def test_every_interpreter_variable_has_the_one_name_scheme():
    names = set()
    for path in [*text_files(), REPO / "README.md"]:
        if path == Path(__file__):
            continue
        names |= set(LANE_VARIABLE.findall(path.read_text(errors="replace")))
    assert {"ATTN_ALIGN_CI_PYTHON311", "ATTN_ALIGN_CI_PYTHON313"} <= names, sorted(names)  # what the lanes read
    assert all(re.fullmatch(r"ATTN_ALIGN_CI_PYTHON3\d\d", name) for name in names), sorted(names)


def find_python(version: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_ALIGN_CI_PYTHON")} | env
    return subprocess.run(
        ["bash", "-c", f"source .ci/python.sh && find_python {version}"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_find_python_takes_the_variable_then_finds_by_name():
    assert find_python("3.12", ATTN_ALIGN_CI_PYTHON312="/opt/any/python").stdout == "/opt/any/python\n"
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    shim = Path(sys.executable).parent  # a folder holding a python3.X of this very version
    found = find_python(here, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
    assert found.returncode == 0, found.stderr
    probe = [found.stdout.strip(), "-c", "import sys; print(sys.version_info[:2])"]
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == str(sys.version_info[:2])


def test_find_python_names_the_variable_when_nothing_is_found():
    missing = find_python("3.99")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == "no Python 3.99 found: set ATTN_ALIGN_CI_PYTHON399 to one\n"
