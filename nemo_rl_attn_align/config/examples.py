"""The packaged example recipes: complete NeMo-RL recipes shipped in the wheel, with our keys set."""

from __future__ import annotations

from pathlib import Path

#: The example ``check`` reads when no CONFIG is given.
DEFAULT_EXAMPLE = "grpo_math_1B_megatron_flash.yaml"

#: Where the packaged example recipes live.
EXAMPLES_DIR = Path(__file__).parent.parent / "examples" / "configs"


def default_example_path() -> Path:
    """Path of the packaged GRPO + Megatron + flash example config."""
    return EXAMPLES_DIR / DEFAULT_EXAMPLE


def example_paths() -> list[Path]:
    """Every packaged example recipe, by name."""
    return sorted(EXAMPLES_DIR.glob("*.yaml"))
