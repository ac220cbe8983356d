"""Imported first by the table scripts, so that they run (and write the tables of) this checkout's
plugin, not an installed copy's: a lane venv installs the plugin non-editable, and its ``.pth``
imports that copy at interpreter start. Stdlib only."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if not str(getattr(sys.modules.get("nemo_rl_attn_align"), "__file__", REPO)).startswith(str(REPO)):
    for _name in [m for m in sys.modules if m.split(".")[0] == "nemo_rl_attn_align"]:
        del sys.modules[_name]
