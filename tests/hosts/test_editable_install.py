"""``pip install -e .`` (what the README's set-up and ``.ci/run`` use) against the real setuptools.

``setup.py`` adds the bootstrap ``.pth`` to the finished editable wheel (``editable_wheel.run``, a
public command API, as coverage.py does): this test builds a real editable install into a bare venv
and checks what a developer relies on, so a setuptools release that changes how editable wheels are
made fails here, not on a user's machine. The editable wheel is built through PEP 660's
``build_editable`` hook (what pip calls) with the setuptools of this environment, which must satisfy
the build requirement ``pyproject.toml`` declares (checked too).
"""

from __future__ import annotations

import ast
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


def test_this_setuptools_satisfies_the_declared_build_requirement():
    text = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11+; the build table is one line
    [line] = [ln for ln in text.splitlines() if ln.startswith("requires = [")]
    requires = re.findall(r'"([^"]+)"', line)
    [spec] = [Requirement(r) for r in requires if Requirement(r).name == "setuptools"]
    assert spec.specifier.contains(setuptools.__version__), (setuptools.__version__, str(spec))


def test_setup_py_overrides_no_private_setuptools_method():
    """A private method of a setuptools command may change in any release (no upper bound guards it)."""
    from setuptools.command.build_py import build_py
    from setuptools.command.editable_wheel import editable_wheel

    bases = {"build_py": build_py, "editable_wheel": editable_wheel}
    tree = ast.parse((REPO / "setup.py").read_text())
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        [base] = [bases[b.id] for b in cls.bases if isinstance(b, ast.Name)]
        methods = [node.name for node in cls.body if isinstance(node, ast.FunctionDef)]
        assert not [m for m in methods if m.startswith("_") and hasattr(base, m)], (cls.name, methods)


def test_editable_install_ships_the_pth_and_activates(editable):
    python, source = editable
    site = site_packages(python)
    assert (site / "nemo_rl_attn_align.pth").read_text() == (REPO / "nemo_rl_attn_align.pth").read_text()
    assert list(site.glob("__editable__*nemo_rl_attn_align*.pth")), sorted(p.name for p in site.iterdir())
    [record] = site.glob("nemo_rl_attn_align-*.dist-info/RECORD")  # so pip uninstall removes it too
    assert any(line.startswith("nemo_rl_attn_align.pth,sha256=") for line in record.read_text().splitlines())
    seen = probe(python)
    assert seen["origin"] == "pth" and seen["heavy"] == [] and seen["pythonpath"] == ""
    where = run_python(python, "import nemo_rl_attn_align; print(nemo_rl_attn_align.__file__)")
    assert Path(where.stdout.strip()).resolve() == (source / "nemo_rl_attn_align" / "__init__.py").resolve()


def test_an_edit_in_the_tree_is_seen_without_reinstalling(editable):
    python, source = editable
    (source / "nemo_rl_attn_align" / "config" / "edited_after_install.py").write_text("VALUE = 42\n")
    out = run_python(python, "from nemo_rl_attn_align.config.edited_after_install import VALUE; print(VALUE)")
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr


def test_examples_are_read_from_the_source_tree(editable):
    """The one copy of the recipes is ``examples/configs`` at the root; an editable install reads it there."""
    python, source = editable
    out = run_python(python, "import sys; from nemo_rl_attn_align.cli import main; sys.exit(main(['examples']))")
    paths = [Path(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0 and paths, out.stderr
    assert {p.resolve().parent for p in paths} == {(source / "examples" / "configs").resolve()}
    assert sorted(p.name for p in paths) == sorted(p.name for p in (REPO / "examples" / "configs").glob("*.yaml"))
