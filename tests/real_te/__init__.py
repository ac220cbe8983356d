"""Real Transformer Engine Python on declared GPUs (lane ``.ci/lanes/te.sh``, marker ``real_te``)."""

from __future__ import annotations

import importlib.util

import pytest


def require_te() -> None:
    """Skip the calling test module, with one line, where real TE or megatron-core is not installed
    (``.ci/run`` fails such a skip in the lane, where both are)."""
    missing = [name for name in ("transformer_engine", "megatron") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed here; .ci/lanes/te.sh installs the real TE Python",
            allow_module_level=True,
        )
