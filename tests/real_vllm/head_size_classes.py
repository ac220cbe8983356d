"""vLLM's CUDA selector on head sizes the rollout table holds one class of: ``python -m
tests.real_vllm.head_size_classes`` prints, as JSON, every sampled query whose answer differs from
its class representative's (``kernels.kernel_table.rollout_head_size``): [] when the classes are exact.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

from nemo_rl_attn_align.kernels import kernel_table, vllm_selector
from nemo_rl_attn_align.kernels.gpu import capability
from tests.real_vllm import cuda_stand_ins

SIZES = [*range(8, 656, 8), 12, 20, 36, 44, 52, 100, 132, 260, 300, 520]


def mismatches(samples: int = 1500, seed: int = 29) -> list[dict]:
    rng = random.Random(seed)
    queries = list(kernel_table.rollout_queries())
    out = []
    for _ in range(samples):
        cell = rng.choice(queries)
        size = rng.choice(SIZES)
        exact, rep = replace(cell, head_size=size), replace(cell, head_size=kernel_table.rollout_head_size(size))
        with cuda_stand_ins.declare_gpu(capability(cell.gpu)):
            a, b = vllm_selector.select(exact), vllm_selector.select(rep)
        if (a.kernel, a.version) != (b.kernel, b.version):
            out.append({"query": str(exact), "exact": a.label, "class": b.label})
    return out


if __name__ == "__main__":
    print(json.dumps(mismatches()))
