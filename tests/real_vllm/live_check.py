"""``check`` on a declared GPU with vLLM installed: ``python -m tests.real_vllm.live_check GPU CONFIG``.

Declares GPU (``cuda_stand_ins``) as this machine's, runs ``check``'s ``evaluate`` on CONFIG and
prints its ``kernels`` section as JSON: the rollout kernel then comes from vLLM's selector run in
this process, not from the table. Its own process: the stand-ins stay out of the engine tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nemo_rl_attn_align.cli import check
from nemo_rl_attn_align.kernels import gpu as gpus
from nemo_rl_attn_align.kernels.gpu import capability
from tests.real_vllm import cuda_stand_ins


def main() -> None:
    gpu, config = sys.argv[1], Path(sys.argv[2])
    gpus.local_gpu = lambda: (gpu, "declared by tests/real_vllm/live_check.py")
    with cuda_stand_ins.declare_gpu(capability(gpu)):
        print(json.dumps(check.evaluate(config, sys.argv[3:], environ={})["kernels"]))


if __name__ == "__main__":
    main()
