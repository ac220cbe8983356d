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
    from nemo_rl_attn_align.report.report_render import format_table

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


def _cell(result: dict[str, Any], dname: str, training: str, rollout: str) -> tuple[float, str]:
    """One heatmap cell: (max |d logprob|, its label); NaN and why where the pair did not run."""
    pair = next(
        (p for p in result["pairs"] if (p["dtype"], p["training"], p["rollout"]) == (dname, training, rollout)),
        None,
    )
    if pair is not None:
        value = pair["logprob_abs_max"]
        return value, "0\nbit-equal" if pair.get("bitwise_equal") else f"{value:.3g}"
    not_replayable = [e for e in (training, rollout) if e in result.get("not_replayable", [])]
    if not_replayable:
        return math.nan, "not run:\nnot replayable"
    skipped = [s["engine"] for s in result.get("skipped", []) if s["dtype"] == dname]
    if training in skipped or rollout in skipped:
        return math.nan, f"not run:\nno {dname} kernel"
    return math.nan, "not run"


def _wrapped(engine: str) -> str:
    """An engine's name on short lines (its options one a line), for a column label."""
    name, _, options = engine.partition(":")
    return "\n".join([name, *options.split(",")]) if options else name


def write_heatmap(result: dict[str, Any], path: Path) -> str | None:
    """PNG heatmap of max |d logprob|: one panel per dtype, stacked, training engines x rollout
    engines, every cell labelled (a pair that did not run: why); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        return None
    training, rollout, dtypes = result["training"], result["rollout"], result["dtypes"]
    colours = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")  # a pair that did not run: grey
    heights = [1.0 + 0.62 * len(training) for _ in dtypes]
    width = max(7.5, 2.6 + 1.55 * len(rollout))
    fig = Figure(figsize=(width, sum(heights) + 0.9), dpi=110)
    axes = fig.subplots(len(dtypes), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, dname in zip(axes, dtypes, strict=True):
        cells = [[_cell(result, dname, t, r) for r in rollout] for t in training]
        grid = [[value for value, _ in row] for row in cells]
        image = ax.imshow(grid, cmap=colours, aspect="auto", vmin=0)  # the colour says how large, from 0
        for i, row in enumerate(cells):
            for j, (value, label) in enumerate(row):
                colour = "#555555" if math.isnan(value) else ("black" if image.norm(value) > 0.6 else "white")
                ax.text(j, i, label, ha="center", va="center", color=colour, fontsize=8.5)
        ax.set_xticks(range(len(rollout)), [_wrapped(r) for r in rollout] if ax is axes[0] else [], fontsize=8.5)
        ax.xaxis.tick_top()
        ax.tick_params(top=ax is axes[0])
        ax.set_yticks(range(len(training)), training, fontsize=8.5)
        ax.set_ylabel(f"{dname}\ntraining", fontsize=9)
        scale = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01).ax
        scale.tick_params(labelsize=8)
        scale.set_visible(len({v for row in grid for v in row if not math.isnan(v)}) > 1)  # a scale needs two values
    axes[0].set_title("rollout", fontsize=9)
    shape = result["shape"]
    fig.suptitle(
        f"max |d logprob| per (training, rollout) pair on {result.get('gpu', DEFAULT_GPU)}: heads={shape['heads']} "
        f"kv_heads={shape['kv_heads']} head_dim={shape['head_dim']} seq_len={shape['seq_len']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    return str(path)
