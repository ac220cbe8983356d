"""The determinism probe: what one worker's process really runs with.

``probe()`` runs inside a worker after its engine is up (vLLM's batch-invariant mode rewrites the
environment inside its worker) and records the determinism environment variables (unset is kept
apart from any value) and, when torch is there, its TF32 / reduced-precision / deterministic flags.
``determinism.compare`` puts two probes side by side. Stdlib only; torch is imported inside
``probe`` when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Variables whose difference in meaning blocks the binding.
BLOCKING_VARIABLES = ("NCCL_ALGO", "NCCL_PROTO", "CUBLAS_WORKSPACE_CONFIG")

#: Other variables always recorded (every other ``NCCL_*`` present is recorded too).
RECORDED_VARIABLES = (
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "VLLM_BATCH_INVARIANT",
    "VLLM_ALLREDUCE_USE_SYMM_MEM",
    "NCCL_LAUNCH_MODE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_NET_DISABLE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_NTHREADS",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_CUMEM_ENABLE",
    "NVTE_FLASH_ATTN",
    "NVTE_FUSED_ATTN",
    "NVTE_UNFUSED_ATTN",
)


def _torch_flags(torch: Any) -> dict[str, Any]:
    """The determinism-relevant torch flags; a flag this torch lacks is recorded as an error text."""
    readers: dict[str, Callable[[], Any]] = {
        "torch_version": lambda: str(torch.__version__),
        "matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "matmul_fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cudnn_conv_fp32_precision": lambda: torch.backends.cudnn.conv.fp32_precision,
        "matmul_allow_fp16_reduced_precision_reduction": lambda: (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "matmul_allow_bf16_reduced_precision_reduction": lambda: (
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "deterministic_algorithms": lambda: torch.are_deterministic_algorithms_enabled(),
        "deterministic_algorithms_warn_only": lambda: torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": lambda: torch.backends.cudnn.deterministic,
        "cudnn_benchmark": lambda: torch.backends.cudnn.benchmark,
    }
    flags = {}
    for name, read in readers.items():
        try:
            value = read()
        except Exception as err:
            value = f"unreadable: {type(err).__name__}: {err}"
        flags[name] = list(value) if isinstance(value, tuple) else value
    return flags


@dataclass(frozen=True)
class DeterminismProbe:
    """One process's determinism facts: ``env`` maps every watched variable to its value or
    ``None`` (unset); ``torch`` holds the flags, ``None`` when torch was not probed, and
    ``torch_status`` says why (``probed``, ``not_probed``, ``unavailable: ...``)."""

    env: Mapping[str, str | None]
    torch: Mapping[str, Any] | None
    torch_status: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": dict(self.env),
            "torch": dict(self.torch) if self.torch is not None else None,
            "torch_status": self.torch_status,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeterminismProbe:
        if not isinstance(data, Mapping) or set(data) != {"env", "torch", "torch_status"}:
            raise ValueError(f"a determinism probe needs env, torch and torch_status, got {data!r}")
        env = data["env"]
        if not isinstance(env, Mapping) or not all(v is None or isinstance(v, str) for v in env.values()):
            raise ValueError("determinism probe env must map names to strings or null")
        return cls(dict(env), None if data["torch"] is None else dict(data["torch"]), str(data["torch_status"]))


def probe(env: Mapping[str, str] | None = None, torch_module: Any = None) -> DeterminismProbe:
    """Probe ``env`` (default ``os.environ``) and torch's flags.

    ``torch_module``: a torch module to read; ``None`` uses the imported torch or imports it
    (recording ``unavailable`` when it cannot be imported); ``False`` skips torch.
    """
    env = os.environ if env is None else env
    watched = set(BLOCKING_VARIABLES) | set(RECORDED_VARIABLES) | {k for k in env if k.startswith("NCCL_")}
    values = {name: env.get(name) for name in sorted(watched)}
    if torch_module is False:
        return DeterminismProbe(values, None, "not_probed")
    if torch_module is None:
        torch_module = sys.modules.get("torch")
        if torch_module is None:
            try:
                import torch as torch_module
            except Exception as err:
                return DeterminismProbe(values, None, f"unavailable: {type(err).__name__}: {err}")
    return DeterminismProbe(values, _torch_flags(torch_module), "probed")
