"""``nemo-rl-attn-align examples [NAME]``: the packaged recipes' paths, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nemo_rl_attn_align
from nemo_rl_attn_align.config.example_recipes import EXAMPLES_DIR

PACKAGE = Path(nemo_rl_attn_align.__file__).parent


def examples(*args):
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "examples", *args], capture_output=True, text=True, timeout=60
    )


def test_lists_every_packaged_recipe_by_absolute_path():
    proc = examples()
    paths = [Path(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(paths) == 3
    # where the recipes are: inside an installed package (a wheel), else the source tree's examples/configs
    assert all(p.is_absolute() and p.is_file() and p.parent == EXAMPLES_DIR for p in paths)
    assert EXAMPLES_DIR in (PACKAGE / "examples" / "configs", PACKAGE.parent / "examples" / "configs")


def test_one_name_prints_its_path_and_checks():
    proc = examples("grpo_math_1B_megatron_flash")  # ".yaml" may be left out
    path = proc.stdout.strip()
    assert proc.returncode == 0 and path.endswith("grpo_math_1B_megatron_flash.yaml")
    checked = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", path], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and "preset aligned" in checked.stdout


def test_unknown_name_is_one_line_exit_2():
    proc = examples("grpo.yaml")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert "sft_megatron_flash.yaml" in proc.stderr
