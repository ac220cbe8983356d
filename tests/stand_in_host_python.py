"""A stand-in for the interpreter of a host's venv in ``check``'s behaviour preview (base lane: no
Megatron-Bridge, no vLLM): run as ``stand_in_host_python.py -m MODULE SIDE_JSON OUT_JSON``, the
command ``cli/check_behaviour.py`` gives a side's interpreter, it writes the answer the side's
process writes (``hosts/behaviour_preview.py``), its fields ``tests.behaviour_samples``' values, and
names in ``substitutions`` what it was given: the module, the side's engine and its model.
``ATTN_ALIGN_STAND_IN_WINDOW=N`` gives the training side's layer 0 a window of N keys;
``ATTN_ALIGN_STAND_IN_FAIL=1`` makes it fail as a crashed host does (a traceback, exit 1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.vocab.behaviour import mask, per_layer
from tests.behaviour_samples import MASK, ROPE, SOFTMAX


def main(argv: list[str]) -> int:
    _, module, side_json, out_json = argv
    if os.environ.get("ATTN_ALIGN_STAND_IN_FAIL"):
        print("Traceback (most recent call last):\nRuntimeError: the stand-in host crashed", file=sys.stderr)
        return 1
    side = json.loads(Path(side_json).read_text())
    window = os.environ.get("ATTN_ALIGN_STAND_IN_WINDOW")
    shown = MASK
    if side["engine"] == "megatron-bridge" and window:
        shown = mask(per_layer({0: {"causal": True, "window": int(window)}, 1: {"causal": True, "window": None}}), "")
    fields = {"rope": ROPE, "mask": shown, "softmax": SOFTMAX}
    answer = {
        "host": "stand-in (stand-in 1.0)",
        "fields": {
            name: FieldValue.observed(value, f"{name} as the stand-in read it").to_dict()
            for name, value in fields.items()
        },
        "problems": [],
        "substitutions": [f"{module} {side['engine']} {side['model'].get('checkpoint') or side['model'].get('model')}"],
        "seconds": 0.0,
    }
    Path(out_json).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
