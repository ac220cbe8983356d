"""The GPU generation a prediction is for: ``check --gpu``, else this machine's GPU (stdlib only).

The local GPU is read from ``nvidia-smi --query-gpu=compute_cap`` (no torch, no CUDA context); a
machine without it, or whose GPUs differ, has no local answer and the kernels stay pending.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from nemo_rl_attn_align.errors import UsageError
from nemo_rl_attn_align.preflight.kernel_query import GPUS

#: What ``nvidia-smi`` may take before the answer is "unknown".
NVIDIA_SMI_TIMEOUT_S = 5.0


def parse_gpu(text: str) -> str:
    """``"sm90"`` (or ``"9.0"``, ``"90"``) -> ``"sm90"``; ``UsageError`` naming the choices otherwise."""
    raw = text.strip().lower().removeprefix("sm").replace(".", "")
    gpu = f"sm{raw}"
    if gpu not in GPUS:
        raise UsageError(
            f"--gpu {text!r}: no kernel prediction for this GPU generation. Fix: one of {', '.join(GPUS)}."
        )
    return gpu


def local_gpu(run: Callable = subprocess.run) -> tuple[str | None, str]:
    """(this machine's GPU generation, how it was found), or (None, why there is none)."""
    if shutil.which("nvidia-smi") is None:
        return None, "no GPU on this machine (no nvidia-smi); --gpu sm80|sm90|sm100 predicts for one"
    try:
        done = run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"nvidia-smi did not answer ({err}); --gpu predicts for a GPU generation"
    capabilities = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    if done.returncode != 0 or len(capabilities) != 1:
        return None, f"nvidia-smi reports {sorted(capabilities) or 'no GPU'}; --gpu predicts for one generation"
    gpu = "sm" + capabilities.pop().replace(".", "")
    if gpu not in GPUS:
        return None, f"this machine's GPU is {gpu}, which has no kernel table ({', '.join(GPUS)}); --gpu chooses one"
    return gpu, "this machine's GPU (nvidia-smi)"
