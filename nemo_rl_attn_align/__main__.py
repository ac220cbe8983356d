"""``python -m nemo_rl_attn_align`` runs the command line."""

import sys

from nemo_rl_attn_align.cli import main

sys.exit(main())
