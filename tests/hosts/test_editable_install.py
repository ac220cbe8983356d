"""``pip install -e .`` (what the README's set-up and ``.ci/run`` use) against the real setuptools.

``setup.py`` adds the bootstrap ``.pth`` to the editable wheel through setuptools' editable
strategy, which is not a public API: this test builds a real editable install into a bare venv and
checks what a developer relies on, so a setuptools release that changes the strategy fails here,
not on a user's machine. The editable wheel is built through PEP 660's ``build_editable`` hook (what
pip calls) with the setuptools of this environment, which must lie inside the range
``pyproject.toml`` allows (checked too).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import setuptools
from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.hosts.conftest import copy_source_tree, make_bare_venv, site_packages
from tests.hosts.test_bootstrap import probe, run_python

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def editable(tmp_path_factory) -> tuple[Path, Path]:
    """(python of a bare venv with the plugin installed editable, the source tree it points at)."""
    source = copy_source_tree(tmp_path_factory.mktemp("editable") / "src")
    wheels = tmp_path_factory.mktemp("editable-wheel")
    build = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", build, str(wheels)], cwd=source, check=True, capture_output=True, timeout=300)
    [wheel] = wheels.glob("nemo_rl_attn_align-*.whl")
    python = make_bare_venv(tmp_path_factory.mktemp("editable-venv") / "venv")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return python, source


def test_this_setuptools_is_inside_the_declared_build_range():
    text = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11+; the build table is one line
    [line] = [ln for ln in text.splitlines() if ln.startswith("requires = [")]
    requires = re.findall(r'"([^"]+)"', line)
    [spec] = [Requirement(r) for r in requires if Requirement(r).name == "setuptools"]
    assert spec.specifier.contains(setuptools.__version__), (setuptools.__version__, str(spec))
    assert any(s.operator == "<" for s in spec.specifier), "the private editable API needs an upper bound"


def test_editable_install_ships_the_pth_and_activates(editable):
    python, source = editable
    site = site_packages(python)
    assert (site / "nemo_rl_attn_align.pth").read_text() == (REPO / "nemo_rl_attn_align.pth").read_text()
    assert list(site.glob("__editable__*nemo_rl_attn_align*.pth")), sorted(p.name for p in site.iterdir())
    seen = probe(python)
    assert seen["origin"] == "pth" and seen["heavy"] == [] and seen["pythonpath"] == ""
    where = run_python(python, "import nemo_rl_attn_align; print(nemo_rl_attn_align.__file__)")
    assert Path(where.stdout.strip()).resolve() == (source / "nemo_rl_attn_align" / "__init__.py").resolve()


def test_an_edit_in_the_tree_is_seen_without_reinstalling(editable):
    python, source = editable
    (source / "nemo_rl_attn_align" / "config" / "edited_after_install.py").write_text("VALUE = 42\n")
    out = run_python(python, "from nemo_rl_attn_align.config.edited_after_install import VALUE; print(VALUE)")
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr
