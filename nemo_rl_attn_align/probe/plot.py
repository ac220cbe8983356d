"""Divergence by layer as a PNG (matplotlib, the ``plot`` extra), read at a glance.

Two panels on one log scale: where the two sides differ (each stage's max |diff| by layer, the first
divergence marked) and what each operator adds by itself (RoPE's and attention's measured shares,
the replay estimate). A difference of exactly 0 sits on its own row labelled ``0`` (a log scale has
no zero); a series the result does not hold (no replay named, no RoPE substitution) is said in the
legend; the verdict is the figure's title. 1100 x 550 pixels for any number of layers.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from nemo_rl_attn_align.probe import render
from nemo_rl_attn_align.probe.divergence import STAGES, Difference, ProbeResult
from nemo_rl_attn_align.vocab.errors import UsageError

FIGSIZE_IN, DPI = (11.0, 5.5), 100
NOT_MEASURED = "not measured in this run"
_MARKERS = dict(zip(STAGES, "osD^v", strict=True))


def _shares(result: ProbeResult) -> dict[str, list[Difference | None]]:
    """The operators' own shares by layer, each labelled with what it measures."""
    rows = result.layers
    replay = f"replay estimate ({result.replays[1]} vs {result.replays[0]})" if result.replays else "replay estimate"
    return {
        f"RoPE adds ({result.other}'s RoPE on {result.reference}'s QKV)": [row.rope_share for row in rows],
        f"attention adds ({result.other}'s attention on {result.reference}'s q/k/v)": [
            row.attention_share for row in rows
        ],
        replay: [row.replay_estimate for row in rows],
    }


def _floor(result: ProbeResult) -> float:
    """Where 0 is drawn: a decade under the smallest difference above 0 (1e-12 when there is none)."""
    values = [d.max_abs for row in result.layers for d in row.stages.values()]
    values += [d.max_abs for series in _shares(result).values() for d in series if d is not None]
    positive = [v for v in (*values, result.atol) if v > 0]
    return 10 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1e-12


def _zero_row(ax, floor: float, top: float) -> None:
    """The log axis from ``floor`` (labelled ``0``) to ``top``, the zero row set apart by a dotted line."""
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, max(top, floor * 10) * 3)
    decades = range(math.ceil(math.log10(floor * 10)), math.floor(math.log10(ax.get_ylim()[1])) + 1)
    step = max(1, len(decades) // 6)
    ticks = [10.0**d for d in decades][::step]
    ax.set_yticks([floor, *ticks], ["0", *(f"1e{round(math.log10(t))}" for t in ticks)])
    ax.minorticks_off()
    ax.axhline(floor * 3, color="#999999", linewidth=0.6, linestyle=":")


def _style(ax, layers: list[int], title: str, columns: int) -> None:
    ax.set_xticks(layers if len(layers) <= 24 else layers[:: math.ceil(len(layers) / 24)])
    ax.set_xlabel("layer", fontsize=10)
    ax.set_ylabel("max |diff|", fontsize=10)
    ax.set_title(title, fontsize=11)
    ax.tick_params(labelsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=columns, frameon=False)


def plot(result: ProbeResult, path: Path) -> None:
    """``figure(result)`` written to ``path`` (``UsageError`` without matplotlib)."""
    try:
        figure(result).savefig(path, dpi=DPI)
    except ImportError:
        raise UsageError(
            f"--plot {path}: matplotlib is not installed; pip install 'nemo-rl-attn-align[plot]'"
        ) from None


def figure(result: ProbeResult):
    """Each stage's max |diff| by layer, and what RoPE and attention add by themselves (a matplotlib
    ``Figure``; ``ImportError`` without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    layers = [row.layer for row in result.layers]
    floor = _floor(result)
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    where, adds = fig.subplots(1, 2)
    top = max(_draw_stages(where, result, floor), _draw_shares(adds, result, floor))
    for ax in (where, adds):
        _zero_row(ax, floor, top)
    _style(where, layers, f"where {result.other} and {result.reference} differ, by stage", 3)
    _style(adds, layers, "what each operator adds by itself", 1)
    fig.suptitle("\n".join(textwrap.wrap(render.verdict(result), 150)[:3]), fontsize=10)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.95))
    return fig


def _draw_stages(ax, result: ProbeResult, floor: float) -> float:
    """Each stage's max |diff| by layer, the first divergence marked, ``--atol`` drawn; the top value."""
    layers = [row.layer for row in result.layers]
    top = max(floor, result.atol)
    for stage in STAGES:
        values = [max(row.stages[stage].max_abs, floor) for row in result.layers]
        top = max(top, *values)
        ax.plot(layers, values, marker=_MARKERS[stage], markersize=6, linewidth=1.4, label=stage, alpha=0.85)
    if result.first is not None:
        first = result.first
        ax.annotate(
            f"first difference: {first.operator}",
            (first.layer, max(first.difference.max_abs, floor)),
            xytext=(12, -18),
            textcoords="offset points",
            fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "#444444"},
        )
    if result.atol > 0:
        ax.axhline(result.atol, color="#c62828", linestyle="--", linewidth=1.0, label=f"--atol {result.atol:g}")
    return top


def _draw_shares(ax, result: ProbeResult, floor: float) -> float:
    """RoPE's and attention's measured shares and the replay estimate by layer (one the run did not
    measure said in the legend); the top value."""
    layers, top = [row.layer for row in result.layers], floor
    for (label, series), (style, marker) in zip(
        _shares(result).items(), (("-", "s"), ("-", "o"), ("--", "x")), strict=True
    ):
        if all(d is None for d in series):
            ax.plot([], [], linestyle=style, label=f"{label}: {NOT_MEASURED}")
            continue
        values = [max(d.max_abs, floor) if d is not None else math.nan for d in series]
        top = max(top, *(v for v in values if not math.isnan(v)))
        ax.plot(layers, values, linestyle=style, marker=marker, markersize=6, label=label)
    return top
