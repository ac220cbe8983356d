"""Fixtures for the host tests: a real install of the plugin in a fresh venv, stand-ins on sys.path,
and the bootstrap's process state saved and restored around each in-process test."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from nemo_rl_attn_align.hosts import bootstrap

REPO = Path(__file__).resolve().parents[2]
FAKE_NEMO_RL = REPO / "tests" / "fake_nemo_rl"
FAKE_VLLM = REPO / "tests" / "fake_vllm"
PROJECT_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "nemo_rl_attn_align.pth", "README.md", "LICENSE")


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def make_bare_venv(path: Path) -> Path:
    """A venv without pip and without system site-packages: only the stdlib (like a fresh uv venv)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return venv_python(path)


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def venv_without_plugin(root: Path) -> Path:
    """A venv seeing the driver's site-packages except this plugin and all ``.pth`` files: like
    NeMo-RL's per-worker venvs, it has ray, torch, megatron-core ... but not the plugin."""
    python = make_bare_venv(root / "venv")
    links = root / "site-without-plugin"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.startswith(("nemo_rl_attn_align", "__editable__", "nemo-rl-attn-align")) or name.endswith(".pth"):
            continue
        (links / name).symlink_to(entry)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "driver_site_without_plugin.pth").write_text(f"{links}\n")
    return python


def copy_source_tree(root: Path) -> Path:
    """A copy of the project's build inputs under ``root`` (so a build never touches the checkout)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, root / name)
    if not (root / "README.md").exists():  # pyproject names a readme; its text does not matter here
        (root / "README.md").write_text("nemo-rl-attn-align\n")
    shutil.copytree(
        REPO / "nemo_rl_attn_align", root / "nemo_rl_attn_align", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(REPO / "examples" / "configs", root / "examples" / "configs")  # build_py ships them
    return root


@pytest.fixture(scope="session")
def plugin_wheel(tmp_path_factory) -> Path:
    """The plugin built into a wheel from a copy of the source tree (the tree itself stays clean)."""
    root = copy_source_tree(tmp_path_factory.mktemp("plugin-src"))
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(root)],
        check=True,
        capture_output=True,
    )
    return next(wheels.glob("nemo_rl_attn_align-*.whl"))


@pytest.fixture(scope="session")
def plugin_venv(tmp_path_factory, plugin_wheel) -> Path:
    """Python of a fresh stdlib-only venv with the plugin installed from its wheel (``.pth`` included)."""
    python = make_bare_venv(tmp_path_factory.mktemp("plugin-venv") / "venv")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(plugin_wheel),
        ],
        check=True,
        capture_output=True,
    )
    return python


@pytest.fixture
def bootstrap_state():
    """Save and restore the bootstrap's hooks and ``sys.meta_path`` (the dev env may have the .pth active)."""
    saved_callbacks = {name: list(cbs) for name, cbs in bootstrap._callbacks.items()}
    saved_meta_path, saved_origin = list(sys.meta_path), bootstrap.origin
    yield bootstrap
    bootstrap._callbacks.clear()
    bootstrap._callbacks.update(saved_callbacks)
    sys.meta_path[:] = saved_meta_path
    bootstrap.origin = saved_origin


#: The stand-in NeMo-RL's Megatron policy worker module (``hooked`` imports it).
MEGATRON_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"


@pytest.fixture
def hooked(bootstrap_state, monkeypatch, tmp_path):
    """Activate the bootstrap, import a stand-in NeMo-RL layout through it, yield its worker module
    (the worker writes under ``tmp_path / "report"``)."""
    from nemo_rl_attn_align.hosts import megatron_worker, packed_boundaries
    from nemo_rl_attn_align.preflight.backend import NVTE_VARIABLES

    for name in NVTE_VARIABLES:  # set, then unset: each goes back to how it was (Megatron sets them)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_REPORT_DIR", str(tmp_path / "report"))
    monkeypatch.delenv("NEMO_RL_ATTN_ALIGN_STRICT", raising=False)
    monkeypatch.setattr(megatron_worker, "record", megatron_worker.TrainingRecord())

    def load(version: str):
        stack.enter_context(standin(FAKE_NEMO_RL / version, "nemo_rl"))
        bootstrap_state.deactivate()
        assert bootstrap_state.activate("test")
        __import__(MEGATRON_WORKER)
        return sys.modules[MEGATRON_WORKER]

    with contextlib.ExitStack() as stack:
        yield load
        megatron_worker.detach()
        packed_boundaries.detach()
        packed_boundaries.pending = None


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> str:
    """One local Ray cluster (2 CPUs) for the session; its address. Ray puts the connecting driver's
    cwd on its workers' sys.path, and a NeMo-RL driver runs from NeMo-RL's checkout, not from this
    source tree: connect from elsewhere."""
    ray = pytest.importorskip("ray")
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("driver-cwd"))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        os.chdir(cwd)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@contextlib.contextmanager
def standin(root: Path, package: str):
    """Import ``package`` from the stand-in tree ``root``; forget it (and its submodules) afterwards."""

    def purge():
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]

    purge()
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        purge()
