"""The wheel ships the one copy of the example recipes (``examples/configs`` at the repository root,
copied in by ``setup.py``'s ``build_py``): ``nemo-rl-attn-align examples`` in a fresh venv with only
the wheel installed lists them inside the installed package, byte for byte the repository's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.hosts.conftest import site_packages
from tests.hosts.test_bootstrap import clean_env


def test_the_installed_wheel_lists_the_repository_recipes(plugin_venv):
    script = plugin_venv.parent / "nemo-rl-attn-align"  # the console script of that venv
    out = subprocess.run(
        [str(script), "examples"], capture_output=True, text=True, timeout=60, env=clean_env(), cwd=plugin_venv.parent
    )
    assert out.returncode == 0, out.stderr
    paths = [Path(line) for line in out.stdout.splitlines()]
    packaged = site_packages(plugin_venv) / "nemo_rl_attn_align" / "examples" / "configs"
    sources = sorted((REPO / "examples" / "configs").glob("*.yaml"))
    assert sources and [p.name for p in paths] == [p.name for p in sources]
    assert all(p.parent == packaged and p.read_bytes() == s.read_bytes() for p, s in zip(paths, sources, strict=True))


def test_the_repository_holds_one_copy_and_no_link():
    assert sorted((REPO / "examples" / "configs").glob("*.yaml"))
    assert not (REPO / "nemo_rl_attn_align" / "examples").exists()
    assert not list((REPO / "nemo_rl_attn_align").rglob("*.yaml"))
    assert not any((REPO / p).is_symlink() for p in ("examples", "examples/configs"))
