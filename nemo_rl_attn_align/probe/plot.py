"""Divergence by layer as a PNG (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

from nemo_rl_attn_align.probe.divergence import STAGES, ProbeResult
from nemo_rl_attn_align.vocab.errors import UsageError


def plot(result: ProbeResult, path: Path) -> None:
    """Each stage's max |diff| by layer, and attention's share, on a log scale; written to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            f"--plot {path}: matplotlib is not installed; pip install 'nemo-rl-attn-align[plot]'"
        ) from None
    layers = [row.layer for row in result.layers]
    floor = 1e-12  # a difference of 0 drawn at the floor of the log scale
    fig, ax = plt.subplots(figsize=(7, 4))
    for stage in STAGES:
        ax.plot(layers, [max(row.stages[stage].max_abs, floor) for row in result.layers], marker="o", label=stage)
    shares = [row.attention_share for row in result.layers]
    if all(share is not None for share in shares):
        ax.plot(layers, [max(s.max_abs, floor) for s in shares if s], "k--", marker="x", label="attention adds")
    ax.set_yscale("log")
    ax.set_xticks(layers)
    ax.set_xlabel("layer")
    ax.set_ylabel("max |diff|")
    ax.set_title(f"{result.other} vs {result.reference}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
