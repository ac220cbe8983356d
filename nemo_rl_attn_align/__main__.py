"""``python -m nemo_rl_attn_align`` runs the command line."""

from nemo_rl_attn_align.cli import console

console()
