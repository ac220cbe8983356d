"""The training kernel table for the TE this interpreter imports: ``python -m tests.real_te.table_worker OUT``.

Runs the plugin's ``kernels.te_selector.select`` (TE's real ``get_attention_backend``) on every cell of
``kernels.kernel_table.TRAINING_AXES``, each on its declared GPU with flash-attn 2.8.3 (and the
flash-attn 3 hopper build where the cell says so), and writes that TE version's encoded table as
JSON to OUT. ``scripts/update_kernel_tables.py`` runs it once per TE version (another version's
wheel on ``PYTHONPATH`` first) and the lane test compares its answers with the committed table.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from importlib.metadata import version

from tests.real_te import stand_ins

stand_ins.install()

from nemo_rl_attn_align.kernels import kernel_table, te_selector  # noqa: E402
from nemo_rl_attn_align.kernels.gpu import capability  # noqa: E402
from nemo_rl_attn_align.kernels.kernel_query import Kernel  # noqa: E402

FLASH_ATTN, FLASH_ATTN_3 = "2.8.3", "3.0.0b1"


def _select(query) -> Kernel:
    """TE's answer, marked ``belief`` when TE consulted the stand-in for its C++ FusedAttention check."""
    consulted = stand_ins.fused_consultations
    kernel = te_selector.select(query)
    return replace(kernel, source="", belief=stand_ins.fused_consultations > consulted)


def answers() -> list[Kernel]:
    """TE's answer for every training cell, in table order."""
    queries = list(kernel_table.training_queries())
    out: list[Kernel | None] = [None] * len(queries)
    groups: dict[tuple, list[int]] = {}
    for index, query in enumerate(queries):
        groups.setdefault((query.gpu, query.flash_attn_3), []).append(index)
    for (gpu, fa3), indices in groups.items():
        with stand_ins.declared_device(
            capability(gpu), flash_attn=FLASH_ATTN, flash_attn_3=FLASH_ATTN_3 if fa3 else None
        ):
            for index in indices:
                out[index] = _select(queries[index])
    return [kernel for kernel in out if kernel is not None]


def header() -> dict:
    """What the table came from, what it declared and held fixed."""
    cudnn = ".".join(map(str, stand_ins.DEFAULT_CUDNN))
    return {
        "host": "Transformer Engine",
        "selector": "transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend",
        "versions": {"transformer-engine": version("transformer-engine")},
        "declared": {"cuDNN": cudnn, "flash-attn": FLASH_ATTN, "flash-attn-3 (with --fa3)": FLASH_ATTN_3},
        "fixed": dict(kernel_table.TRAINING_FIXED),
        "belief": stand_ins.BELIEF,
    }


def main() -> None:
    table = kernel_table.encode("training", header(), answers())
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(table, out)


if __name__ == "__main__":
    main()
