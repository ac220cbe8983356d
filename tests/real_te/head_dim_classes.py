"""Transformer Engine's selector on head-dim pairs the training table holds one class of: ``python -m
tests.real_te.head_dim_classes`` prints, as JSON, every sampled query whose answer differs from its
class representative's (``kernels.kernel_table.training_head_dims``): [] when the classes are exact.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

from tests.real_te import stand_ins

stand_ins.install()

from nemo_rl_attn_align.kernels import kernel_table, te_selector  # noqa: E402
from nemo_rl_attn_align.kernels.gpu import capability  # noqa: E402
from tests.real_te.table_worker import FLASH_ATTN, FLASH_ATTN_3  # noqa: E402

DIMS = [*range(8, 656, 8), 12, 20, 36, 100, 132, 260, 300]
MLA = [(qk, v) for qk in range(136, 200, 8) for v in range(104, 136, 8)]


def mismatches(samples: int = 1500, seed: int = 29) -> list[dict]:
    rng = random.Random(seed)
    queries = list(kernel_table.training_queries())
    out = []
    for _ in range(samples):
        cell = rng.choice(queries)
        qk, v = rng.choice(MLA) if rng.random() < 0.2 else (d := rng.choice(DIMS), d)
        rep = kernel_table.training_head_dims(qk, v)
        if rep is None:
            continue
        rq, rv = (int(x) for x in rep.split("/"))
        fa3 = FLASH_ATTN_3 if cell.flash_attn_3 else None
        with stand_ins.declared_device(capability(cell.gpu), flash_attn=FLASH_ATTN, flash_attn_3=fa3):
            a = te_selector.select(replace(cell, head_dim_qk=qk, head_dim_v=v))
            b = te_selector.select(replace(cell, head_dim_qk=rq, head_dim_v=rv))
        if (a.kernel, a.version) != (b.kernel, b.version):
            out.append({"query": str(replace(cell, head_dim_qk=qk, head_dim_v=v)), "exact": a.label, "class": b.label})
    return out


if __name__ == "__main__":
    print(json.dumps(mismatches()))
