"""Real Transformer Engine Python for the ``real_te`` lane (``.ci/lanes/te.sh``).

The lane's venv holds the real ``transformer-engine`` wheel (its Python; ``stand_ins`` replaces the
compiled core and declares the GPU) beside real megatron-core. Outside the lane, where TE is not
installed, these tests skip with one line (``.ci/run`` turns a skip into a failure in the lane).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Skip this folder's tests, with one line, where real TE or megatron-core is not installed."""
    missing = [
        name for name in ("transformer_engine", "megatron.core") if importlib.util.find_spec(name.split(".")[0]) is None
    ]
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed here; .ci/lanes/te.sh installs the real TE Python"
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
