"""The CPU stand-in for Transformer Engine (``probe/te_stand_in.py``), in a fresh interpreter:
installed only where no real TE can be found, it makes any ``transformer_engine.*`` module, its
CamelCase names ``torch.nn.Module`` subclasses and its other names callable submodules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from nemo_rl_attn_align.probe import te_stand_in
assert te_stand_in.install_if_absent() and te_stand_in.install_if_absent()
import torch, transformer_engine, transformer_engine.pytorch as te
assert transformer_engine.__version__ == te_stand_in.STAND_IN_TE_VERSION
assert issubclass(te.LayerNormLinear, torch.nn.Module) and te.fp8_autocast(enabled=False) is None
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="a real TE is installed here")
def test_the_stand_in_makes_transformer_engine_where_it_is_absent():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
