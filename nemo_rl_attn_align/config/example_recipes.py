"""The example recipes: complete NeMo-RL recipes with our keys set.

The one copy lives at the repository root, ``examples/configs/``. A wheel ships it inside the
package (``setup.py``'s ``build_py`` copies it to ``nemo_rl_attn_align/examples/configs``); an
editable install or a checkout on ``sys.path`` reads it from the source tree.
"""

from __future__ import annotations

from pathlib import Path

#: The example ``check`` reads when no CONFIG is given.
DEFAULT_EXAMPLE = "grpo_math_1B_megatron_flash.yaml"

_PACKAGED = Path(__file__).parent.parent / "examples" / "configs"
_SOURCE_TREE = Path(__file__).parent.parent.parent / "examples" / "configs"
#: Where the example recipes are: inside the installed package (a wheel), else in the source tree.
EXAMPLES_DIR = _PACKAGED if _PACKAGED.is_dir() else _SOURCE_TREE


def default_example_path() -> Path:
    """Path of the GRPO + Megatron + flash example config."""
    return EXAMPLES_DIR / DEFAULT_EXAMPLE


def example_paths() -> list[Path]:
    """Every example recipe, by name."""
    return sorted(EXAMPLES_DIR.glob("*.yaml"))
