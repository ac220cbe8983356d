"""Real Transformer Engine Python on declared GPUs (lane ``.ci/lanes/te.sh``, marker ``real_te``)."""

from __future__ import annotations

import importlib.util
import os

import pytest

#: Other Transformer Engine versions (folders installed with --target) that the lane sets beside the
#: venv's own; a test runs each first on PYTHONPATH in a subprocess.
TE_PATHS = [p for p in os.environ.get("ATTN_ALIGN_TEST_TE_PATHS", "").split(os.pathsep) if p]


def require_te() -> None:
    """Skip the calling test module, with one line, where real TE or megatron-core is not installed
    (``.ci/run`` fails such a skip in the lane, where both are)."""
    missing = [name for name in ("transformer_engine", "megatron") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed here; .ci/lanes/te.sh installs the real TE Python",
            allow_module_level=True,
        )
