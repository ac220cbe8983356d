"""``python -m tests.real_vllm.preview_sides SIDES_JSON``: ``check``'s rollout preview
(``hosts.behaviour_preview``: vLLM's model built on the meta device, read by the engine's own
behaviour reader) of each side in ``SIDES_JSON`` (name -> the ``LLM(...)`` arguments), in this one
process (vLLM is imported once). Prints one JSON line: name -> the preview side's answer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from nemo_rl_attn_align.hosts.behaviour_preview import preview
    from nemo_rl_attn_align.probe.sides import SideSpec

    sides = json.loads(Path(argv[0]).read_text())
    answers = {name: preview(SideSpec("rollout", engine="vllm", model=model)) for name, model in sides.items()}
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
