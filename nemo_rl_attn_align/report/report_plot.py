"""``report --plot``: NeMo-RL's train/rollout mismatch metrics over a run's steps in one PNG.

One panel per NeMo-RL metric the drift steps carry (``token_mult_prob_error`` with NeMo-RL's 1.05
"framework problem" line, ``gen_kl_error``, ``policy_kl_error``, ``js_divergence_error``); the
attention-only estimate (``drift.attention_only``) is a band from its low to its high figure, with a
line at its value, across the steps, on the panels it has figures for; ``zero_by_construction`` is
a line at the no-drift value; ``unavailable`` (or no estimate) is a note under the panels. The
title carries the binding verdict and the run id. The figure has a fixed size (``PIXELS``).

matplotlib (the ``plot`` extra) is imported only inside ``drift_figure``; the file is written to a
temp file in the target's directory and renamed over it (never half written).
"""

from __future__ import annotations

import math
import os
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.vocab.limits import shown_path, shown_text
from nemo_rl_attn_align.vocab.names import NEMO_RL_DRIFT_METRICS

#: The figure's size in inches and resolution: the PNG is always ``PIXELS`` (width, height).
FIGSIZE_IN = (10.0, 6.0)
DPI = 100
PIXELS = (1000, 600)
#: The default file name, in the report's directory.
PLOT_FILENAME = "attention_align_drift.png"
#: NeMo-RL's mismatch metrics, in panel order.
NEMO_RL_METRICS = tuple(NEMO_RL_DRIFT_METRICS)
#: NeMo-RL's guide: a ``token_mult_prob_error`` above this points at a framework problem.
FRAMEWORK_THRESHOLD = 1.05
#: The value of each metric that means "no drift" (the others: 0).
NO_DRIFT = {"token_mult_prob_error": 1.0}
BAND_LABEL = "attention alone (estimate from replays)"
ZERO_LABEL = "attention alone: 0 by construction"
#: On a panel the estimate has no figure for (the replays give NeMo-RL's logprob metrics only).
NOT_THIS_METRIC = "attention alone: not estimated for this metric"
#: The ``gid`` of the note under the panels (what the estimate is, or why there is none).
NOTE_GID = "attention_note"
NO_STEPS = "no drift steps in the report; the driver records them from NeMo-RL's train metrics"
NO_MATPLOTLIB = "matplotlib is not installed: pip install 'nemo-rl-attn-align[plot]' to write the plot"
_VERDICT_COLOURS = {"pass": "#2e7d32", "incomparable": "#e65100", "fail": "#c62828"}
_OBSERVED, _ESTIMATE, _THRESHOLD = "C0", "C2", "C3"
_NOTE_CHARS, _NOTE_WIDTH = 340, 170


class PlotError(Exception):
    """No plot can be written; ``str(err)`` is one line saying why."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def drift_series(steps: Any) -> dict[str, tuple[list[int], list[float]]]:
    """Metric -> (steps, values) for each of NeMo-RL's metrics some step carries, in panel order
    (entries that are not a step with finite numbers are skipped). ``PlotError`` when none."""
    entries = [s for s in steps if isinstance(s, Mapping)] if isinstance(steps, list) else []
    if not entries:
        raise PlotError(NO_STEPS)
    series: dict[str, tuple[list[int], list[float]]] = {}
    for entry in entries:
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        for name in NEMO_RL_METRICS:
            if _finite(entry.get(name)):
                xs, ys = series.setdefault(name, ([], []))
                xs.append(step)
                ys.append(float(entry[name]))
    if not series:
        raise PlotError(
            f"the report's {len(entries)} drift steps carry none of NeMo-RL's metrics ({', '.join(NEMO_RL_METRICS)})"
        )
    return {name: series[name] for name in NEMO_RL_METRICS if name in series}


def _plain(text: Any, limit: int) -> str:
    """A report string for the figure: one line, cut (matplotlib's math parsing is off where it is drawn)."""
    return shown_text(str(text), limit)


def plot_title(doc: Mapping[str, Any]) -> str:
    """``attention_align drift: verdict PASS, run ID`` (no run part without a run id)."""
    title = f"attention_align drift: verdict {_plain(doc['verdict'], 40).upper()}"
    run_id = doc.get("run_id")
    return f"{title}, run {_plain(run_id, 80)}" if run_id else title


def estimate_note(estimate: Any) -> str:
    """The line under the panels: what the band is, why it is zero, or why there is none."""
    if not isinstance(estimate, Mapping):
        return (
            "attention alone: no estimate in this report "
            "(attention_align.attention_estimate: false, or a report from before the estimate)"
        )
    status, why = estimate.get("status"), _plain(estimate.get("why") or "no reason given", _NOTE_CHARS)
    engines = f"{estimate.get('training_engine')} vs {estimate.get('rollout_engine')}, {estimate.get('dtype')}"
    if status == "estimated":
        return f"band: attention alone ({engines}): {why}"
    if status == "zero_by_construction":
        return f"attention alone: 0 by construction ({why})"
    return f"attention alone: not estimated ({why})"


def estimate_band(estimate: Any, metric: str) -> tuple[float, float, float] | None:
    """(value, low, high) of ``metric`` in an ``estimated`` estimate, None without finite figures."""
    if not isinstance(estimate, Mapping) or estimate.get("status") != "estimated":
        return None
    figures = estimate.get("figures")
    figure = figures.get(metric) if isinstance(figures, Mapping) else None
    if not isinstance(figure, Mapping) or not all(_finite(figure.get(k)) for k in ("value", "low", "high")):
        return None
    value, low, high = (float(figure[k]) for k in ("value", "low", "high"))
    return value, min(low, value, high), max(low, value, high)


def _step_range(series: Mapping[str, tuple[list[int], list[float]]]) -> tuple[float, float]:
    steps = [step for xs, _ in series.values() for step in xs]
    first, last = min(steps), max(steps)
    return (first - 0.5, last + 0.5) if first == last else (float(first), float(last))


def _draw_estimate(ax: Any, metric: str, estimate: Any, x_range: tuple[float, float]) -> float | None:
    """The estimate on one panel; returns the highest value drawn (None when nothing is)."""
    band = estimate_band(estimate, metric)
    if band is not None:
        value, low, high = band
        ax.fill_between(x_range, low, high, color=_ESTIMATE, alpha=0.25, linewidth=0, label=BAND_LABEL)
        ax.plot(x_range, (value, value), color=_ESTIMATE, linewidth=1.2)
        return high
    if isinstance(estimate, Mapping) and estimate.get("status") == "zero_by_construction":
        zero = NO_DRIFT.get(metric, 0.0)
        ax.plot(x_range, (zero, zero), color=_ESTIMATE, linewidth=1.5, linestyle="-.", label=ZERO_LABEL)
        return zero
    return None


def _draw_threshold(ax: Any, top: float) -> None:
    """NeMo-RL's 1.05 line when the data reach a fifth of the way to it, else a legend entry saying
    it is above (in the legend, so the two never overlap)."""
    if top - 1.0 >= 0.2 * (FRAMEWORK_THRESHOLD - 1.0):
        label = f"{FRAMEWORK_THRESHOLD}: NeMo-RL's framework-problem threshold"
        ax.axhline(FRAMEWORK_THRESHOLD, color=_THRESHOLD, linestyle="--", linewidth=1.0, label=label)
    else:
        note = f"NeMo-RL's {FRAMEWORK_THRESHOLD} framework-problem threshold: above this range"
        ax.plot([], [], color=_THRESHOLD, linestyle="--", linewidth=1.0, label=note)


def _draw_panel(ax: Any, metric: str, xy: tuple[Sequence[int], Sequence[float]], estimate: Any, x_range) -> None:
    from matplotlib.ticker import MaxNLocator

    xs, ys = xy
    marker = "." if len(xs) <= 60 else None
    ax.plot(xs, ys, color=_OBSERVED, linewidth=1.0, marker=marker, label=f"observed (NeMo-RL train/{metric})")
    top = _draw_estimate(ax, metric, estimate, x_range)
    if top is None and estimate_band(estimate, "token_mult_prob_error") is not None:  # estimated, not this one
        ax.plot([], [], color=_ESTIMATE, linestyle=":", label=NOT_THIS_METRIC)  # said in the legend
    if metric == "token_mult_prob_error":
        _draw_threshold(ax, max([*ys, *([top] if top is not None else [])]))
    ax.set_xlim(*x_range)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_title(metric, fontsize=10)
    ax.set_xlabel("training step", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.4 * (high - low))  # headroom: the legend stands above the data
    ax.legend(fontsize=8, loc="upper right")


def drift_figure(doc: Mapping[str, Any]) -> Any:
    """The ``matplotlib.figure.Figure`` of the report's drift (``PlotError`` without steps or matplotlib)."""
    series = drift_series(doc["drift"].get("steps"))
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(NO_MATPLOTLIB) from None
    estimate = doc["drift"].get("attention_only")
    rows, cols = (len(series), 1) if len(series) <= 2 else (2, 2)
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    x_range = _step_range(series)
    for ax, (metric, xy) in zip(axes[: len(series)], series.items(), strict=True):
        _draw_panel(ax, metric, xy, estimate, x_range)
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    colour = _VERDICT_COLOURS.get(str(doc["verdict"]), "black")
    fig.suptitle(plot_title(doc), fontsize=11, color=colour, parse_math=False)
    note = "\n".join(textwrap.wrap(estimate_note(estimate), _NOTE_WIDTH)[:2])
    fig.text(0.01, 0.01, note, fontsize=8, ha="left", va="bottom", color="#444444", parse_math=False, gid=NOTE_GID)
    fig.tight_layout(rect=(0.0, 0.05, 1.0, 0.96))
    return fig


def write_drift_plot(doc: Mapping[str, Any], out: str | os.PathLike[str]) -> Path:
    """Draw the report's drift and write it to ``out`` as a PNG of ``PIXELS``, atomically; returns
    the path. ``PlotError`` (one line) without steps, without matplotlib, or when ``out`` cannot be
    written (nothing is left behind then)."""
    out = Path(out)
    fig = drift_figure(doc)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except (OSError, ValueError) as err:  # missing directory, permission, NUL in the path
        raise _write_error(out, err) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format="png", dpi=DPI, metadata={"Software": None})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)  # a directory at OUT fails here
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, (OSError, ValueError)):
            raise _write_error(out, err) from None
        raise
    return out


def _write_error(out: Path, err: Exception) -> PlotError:
    return PlotError(f"{shown_path(out)}: cannot write the plot: {getattr(err, 'strerror', None) or err}")
