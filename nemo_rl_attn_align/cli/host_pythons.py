"""``--training-python`` / ``--rollout-python``: the interpreters of the venvs a NeMo-RL node runs its
workers in (the Megatron policy worker's, with Megatron-Bridge; the vLLM generation worker's), one
definition for every sub-command that runs a side there (``probe`` runs each side's forward,
``check`` computes each side's ``rope``, ``mask`` and ``softmax``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nemo_rl_attn_align.preflight.behaviour_facts import FLAGS
from nemo_rl_attn_align.vocab.errors import UsageError

#: side -> what its venv holds.
VENVS = {"training": "NeMo-RL's Megatron policy worker, with Megatron-Bridge", "rollout": "NeMo-RL's vLLM worker"}


def add_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--training-python`` and ``--rollout-python``; ``what``: what that side's interpreter runs."""
    for side, flag in FLAGS.items():
        parser.add_argument(
            flag, metavar="PY", help=f"the Python of the {side} side's venv ({VENVS[side]}) that {what}"
        )


def interpreter(value: str | None, side: str) -> str | None:
    """``value`` of ``side``'s flag as an absolute path to an executable file (None: not given); a
    ``UsageError`` naming the flag otherwise."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(
            f"{FLAGS[side]} {value}: not an executable file; give the Python of the {side} side's venv "
            f"({VENVS[side]}), e.g. {FLAGS[side]} /opt/venvs/{side}/bin/python"
        )
    return str(path.absolute())
