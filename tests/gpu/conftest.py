"""The GPU-node suite (``pytest -m mcore``): real megatron-core, Transformer Engine and flash-attn on CUDA.

The GPU tests here carry the ``mcore`` marker (the vLLM binding test also ``vllm_gpu``);
``test_suite_inputs.py`` checks their inputs on CPU and runs everywhere. Where something a GPU
test needs is missing, the test is skipped at collection with one line saying what
(no module here imports torch, TE, megatron or vLLM at import time, so collection never errors),
and the run's summary says why the suite did not run. The heavy work runs in fresh subprocesses
(``tests/gpu/*_runner.py``), one per case: TE caches its backend choice per process and Megatron
asserts that NVTE_* variables already set agree with the backend it is asked for. The NeMo-RL
they drive is the real one wherever ``nemo_rl`` is importable, the stand-in layout only where it is
absent (``nemo_rl_host.locate``); the summary says which.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

#: marker -> what it needs besides torch with CUDA: (import names, any of which will do; what to install)
REQUIREMENTS = {
    "mcore": (
        (("megatron.core",), "megatron-core"),
        (("transformer_engine",), "Transformer Engine"),
        (("flash_attn", "flash_attn_interface", "flash_attn_3"), "flash-attn"),
    ),
    "vllm_gpu": (
        (("vllm",), "vLLM"),
        (("transformers",), "transformers (to write the tiny test model)"),
    ),
}
HERE = Path(__file__).resolve().parent
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def missing(markers: tuple[str, ...]) -> list[str]:
    """What tests with ``markers`` lack on this machine (empty when they can run)."""
    if not _importable("torch"):
        return ["torch"]
    absent = [label for marker in markers for names, label in REQUIREMENTS[marker] if not any(map(_importable, names))]
    import torch

    return ([] if torch.cuda.is_available() else [NO_CUDA]) + absent


def describe(problems) -> str:
    """One line: the missing CUDA device first, then what is not installed."""
    installs = [p for p in dict.fromkeys(problems) if p != NO_CUDA]
    parts = ([NO_CUDA] if NO_CUDA in problems else []) + ([", ".join(installs) + " not installed"] if installs else [])
    return "; ".join(parts)


#: node id -> what that skipped item lacked, for the items this conftest skipped in this session
_skipped: dict[str, list[str]] = {}
#: node ids of the ``mcore`` items collected in this session
_mcore: set[str] = set()


def _applies(item) -> tuple[str, ...]:
    """The markers of ``item`` this conftest answers for: ``mcore`` anywhere, ``vllm_gpu`` in this folder."""
    here = Path(str(item.path)).resolve().is_relative_to(HERE)
    return tuple(m for m in REQUIREMENTS if item.get_closest_marker(m) is not None and (m == "mcore" or here))


def pytest_collection_modifyitems(config, items):
    lacking: dict[tuple[str, ...], list[str]] = {}
    for item in items:
        markers = _applies(item)
        if not markers:
            continue
        if "mcore" in markers:
            _mcore.add(item.nodeid)
        if markers not in lacking:
            lacking[markers] = missing(markers)
        if lacking[markers]:
            _skipped[item.nodeid] = lacking[markers]
            item.add_marker(pytest.mark.skip(reason=f"GPU node only: {describe(lacking[markers])}"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.gpu.nemo_rl_host import locate

    if _mcore:
        terminalreporter.write_line(locate().line())
    reports = [r for r in terminalreporter.stats.get("skipped", []) if getattr(r, "nodeid", None) in _skipped]
    if not reports:
        return
    why = describe([p for r in reports for p in _skipped[r.nodeid]])
    terminalreporter.write_line(
        f"mcore suite not run here: {why}; {len(reports)} GPU test(s) skipped. "
        "Run `pytest -m mcore` on a GPU node with CUDA, Transformer Engine, flash-attn and megatron-core "
        "(and vLLM for the binding test).",
        yellow=True,
    )
