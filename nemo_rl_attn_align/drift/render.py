"""A drift sweep's result shown: the text table of its pairs and the max |d logprob| heatmap.

Both read the result dict ``sweep.run_sweep`` returns (or a saved ``drift-report.json``), so
neither needs torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.drift.shape import DEFAULT_GPU


def render_table(result: dict[str, Any]) -> str:
    """The pairs as a fixed-width text table."""
    from nemo_rl_attn_align.report.render import format_table

    rows = [
        [
            p["dtype"],
            p["training"],
            p["rollout"],
            f"{p['out_abs_max']:.3g}",
            f"{p['out_ulp_max']:.2f}",
            f"{100 * p['out_beyond_1ulp']:.2f}%",
            f"{p['lse_abs_max']:.3g}",
            f"{p['logprob_abs_max']:.3g}",
            f"{p['token_mult_prob_error']:.6f}",
        ]
        for p in result["pairs"]
    ]
    s = result["shape"]
    title = (
        f"attention drift on {result.get('gpu', DEFAULT_GPU)}: heads={s['heads']} kv_heads={s['kv_heads']} "
        f"head_dim={s['head_dim']} window={s['window']} seq_len={s['seq_len']}"
    )
    headers = [
        "dtype",
        "training",
        "rollout",
        "max|d out|",
        "max ulp(local)",
        ">1 ulp",
        "max|d lse|",
        "max|d logp|",
        "mult_prob_err",
    ]
    lines = [title, format_table(headers, rows)]
    lines += [f"not replayable: {name} ({result['replays'][name]})" for name in result.get("not_replayable", [])]
    lines += [
        f"replays: {name} = {what}"
        for name, what in result.get("replays", {}).items()
        if name not in result.get("not_replayable", [])
    ]
    return "\n".join(lines)


def write_heatmap(result: dict[str, Any], path: Path) -> str | None:
    """PNG heatmap of max |d logprob| (training x rollout, one panel per dtype); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    training, rollout, dtypes = result["training"], result["rollout"], result["dtypes"]
    fig, axes = plt.subplots(
        1, len(dtypes), figsize=((2.4 + 0.9 * len(rollout)) * len(dtypes), 1.6 + 0.5 * len(training)), squeeze=False
    )
    for ax, dname in zip(axes[0], dtypes, strict=True):
        grid = [
            [
                next(
                    (
                        p["logprob_abs_max"]
                        for p in result["pairs"]
                        if p["dtype"] == dname and p["training"] == t and p["rollout"] == r
                    ),
                    math.nan,
                )
                for r in rollout
            ]
            for t in training
        ]
        image = ax.imshow(grid, cmap="viridis")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2g}", ha="center", va="center", color="w", fontsize=7)
        ax.set_xticks(range(len(rollout)), rollout, rotation=40, ha="right", fontsize=7)
        ax.set_yticks(range(len(training)), training, fontsize=7)
        ax.set_title(f"{dname}: max |d logprob|", fontsize=9)
        ax.set_xlabel("rollout", fontsize=8)
        ax.set_ylabel("training", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
