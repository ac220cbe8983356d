"""The GPUs a prediction is for: every generation the hosts' selectors tell apart, by name (stdlib only).

``GENERATIONS`` is the one vocabulary: each compute capability Transformer Engine's or vLLM's
attention selectors treat differently, with the products that report it. ``parse_gpu`` reads
``check --gpu`` / ``drift --gpu`` (``sm90``, ``9.0``, ``90``, ``sm_90a``, or a product name such as
``H100``, ``B300``, ``L40S``, ``RTX PRO 6000``); ``local_gpu`` reads this machine's GPU from
``nvidia-smi --query-gpu=compute_cap`` (no torch, no CUDA context); a machine without it, or whose
GPUs differ, has no local answer and the kernels stay pending.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from nemo_rl_attn_align.vocab.errors import UsageError

#: What ``nvidia-smi`` may take before the answer is "unknown".
NVIDIA_SMI_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Generation:
    """One compute capability and the data-center / workstation products that report it."""

    name: str  # sm90
    capability: tuple[int, int]
    products: tuple[str, ...]

    @property
    def title(self) -> str:
        """``sm90 (H100, H200, ...)``."""
        return f"{self.name} ({', '.join(self.products)})"


#: Every generation the selectors tell apart (TE: flash-attn 2's head-dim rule names sm80 / sm90 /
#: sm100 / sm120, cuDNN's rules sm90 and the sm100 family; vLLM: FlashInfer / TRT-LLM on the sm100
#: family, FA3 on sm90, the MLA kernels per major), oldest first.
GENERATIONS = (
    Generation("sm80", (8, 0), ("A100", "A800", "A30")),
    Generation("sm86", (8, 6), ("A10", "A10G", "A40", "A16", "A2", "RTX A6000")),
    Generation("sm89", (8, 9), ("L4", "L40", "L40S", "RTX 6000 Ada")),
    Generation("sm90", (9, 0), ("H100", "H200", "H800", "H20", "GH200")),
    Generation("sm100", (10, 0), ("B200", "GB200", "B100")),
    Generation("sm103", (10, 3), ("B300", "GB300")),
    Generation("sm110", (11, 0), ("Jetson Thor",)),
    Generation("sm120", (12, 0), ("RTX PRO 6000", "RTX 5090")),
)
GPUS = tuple(generation.name for generation in GENERATIONS)
BY_NAME = {generation.name: generation for generation in GENERATIONS}


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]+", "", text).upper()


_PRODUCTS = {_key(product): generation.name for generation in GENERATIONS for product in generation.products}


def capability(gpu: str) -> tuple[int, int]:
    """``"sm90"`` -> ``(9, 0)``."""
    return BY_NAME[gpu].capability


def of_capability(major: int, minor: int) -> str | None:
    """The generation reporting compute capability ``major.minor`` (None: one the tables do not cover)."""
    return next((g.name for g in GENERATIONS if g.capability == (major, minor)), None)


def choices() -> str:
    """The accepted names, for error messages."""
    return "; ".join(generation.title for generation in GENERATIONS)


def parse_gpu(text: str, flag: str = "--gpu") -> str:
    """``"sm90"``, ``"9.0"``, ``"90"``, ``"sm_90a"``, ``"H100"`` -> ``"sm90"``; ``UsageError`` naming the choices."""
    key = _key(text)
    if key in _PRODUCTS:
        return _PRODUCTS[key]
    number = re.fullmatch(r"(?:SM)?(\d{1,2})\.?(\d)[AF]?", key)
    gpu = number and of_capability(int(number.group(1)), int(number.group(2)))
    if not gpu:
        raise UsageError(f"{flag} {text!r}: no kernel prediction for this GPU. Fix: one of {choices()}.")
    return gpu


def local_gpu(run: Callable | None = None) -> tuple[str | None, str]:
    """(this machine's GPU generation, how it was found), or (None, why there is none); ``run``:
    ``subprocess.run`` unless given."""
    if shutil.which("nvidia-smi") is None:
        return None, "no GPU on this machine (no nvidia-smi); --gpu NAME (sm90, H100, B200, ...) predicts for one"
    import subprocess  # here: a machine without nvidia-smi (most that run check) never needs it

    run = subprocess.run if run is None else run
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
    reported = capabilities.pop()
    major, _, minor = reported.partition(".")
    gpu = of_capability(int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else None
    if gpu is None:
        return (
            None,
            f"this machine's GPU reports compute capability {reported}, which has no kernel table; --gpu chooses one",
        )
    return gpu, "this machine's GPU (nvidia-smi)"
