"""Shared fixtures: writing real YAML files for the real loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.example_models import write_example_model_cache, write_transformers_config  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "configs"


def module_json(module: str, *args: str, first_on_path: str | None = None, timeout: int = 900) -> Any:
    """What ``python -m module args`` (run in the repository, which is on its path after
    ``first_on_path``) prints as JSON on its last line; a failed run fails the test with its stderr."""
    outer = os.environ.get("PYTHONPATH")
    path = os.pathsep.join(p for p in (first_on_path, str(REPO), outer) if p)
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


#: The hosts the CLI's own process never imports.
HOST_MODULES = ("torch", "transformer_engine", "megatron", "vllm", "ray")


def cli_in_fresh_process(*argv: str) -> tuple[str, list[str]]:
    """The CLI's ``main(argv)`` in a fresh interpreter: what it printed, and the host modules
    (``HOST_MODULES``) that process imported."""
    code = (
        "import json, sys\n"
        "from nemo_rl_attn_align.cli import main\n"
        f"main({list(argv)!r})\n"
        f"print(json.dumps(sorted(m for m in {HOST_MODULES!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    printed, _, imported = done.stdout.rstrip("\n").rpartition("\n")
    return printed, json.loads(imported)


def preview_of(cfg, environ=None, settings=None):
    """``binding.binding_preview.preview_binding`` as ``check`` calls it: the recipe read once with ``environ``
    (default: empty) and its ``attention_align`` settings (unless ``settings`` are given)."""
    from nemo_rl_attn_align.binding.binding_preview import preview_binding
    from nemo_rl_attn_align.config.settings import load_settings
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    environ = {} if environ is None else environ
    return preview_binding(read_recipe_facts(cfg, environ), settings or load_settings(cfg), environ)


@pytest.fixture
def write_yaml(tmp_path):
    """Write ``text`` (dedented) to ``tmp_path / name`` and return the path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(scope="session")
def example_model_cache(tmp_path_factory) -> Path | None:
    """A Hugging Face cache holding ``example_models.EXAMPLE_MODELS`` (None without transformers)."""
    return write_example_model_cache(tmp_path_factory.mktemp("hf-hub"))


@pytest.fixture(scope="session", autouse=True)
def _example_models(example_model_cache):
    """Every test (and the subprocesses it starts) finds ``EXAMPLE_MODELS`` in the Hugging Face cache."""
    if example_model_cache is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_CACHE", str(example_model_cache))
        yield


REQUIRE_REAL = os.environ.get("ATTN_ALIGN_TEST_REQUIRE_REAL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a real-host lane of ``.ci/run`` (ATTN_ALIGN_TEST_REQUIRE_REAL=1) a skip is a failure."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_REAL and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped in a real-host lane (ATTN_ALIGN_TEST_REQUIRE_REAL=1): {reason}"
