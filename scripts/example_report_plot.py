"""Regenerate ``docs/images/report-plot.png``, the README's example of ``report --plot``.

The report is synthetic and deterministic (a fixed seed): 200 GRPO steps whose NeMo-RL metrics sit
around 1.01-1.03 (``token_mult_prob_error``) with noise and one spike past NeMo-RL's 1.05 line, and
an attention-only estimate of about 1.002 (1.001-1.003). No worker records are written, so the
verdict is ``incomparable`` (nothing was bound); only the drift and the title are meant to look
like a real run::

    python scripts/example_report_plot.py            # rewrite docs/images/report-plot.png
    python scripts/example_report_plot.py OUT.png    # write elsewhere
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a checkout that is not installed

from nemo_rl_attn_align.config.settings import AlignSettings  # noqa: E402
from nemo_rl_attn_align.drift.estimate import ESTIMATED, WHY_ESTIMATED, result  # noqa: E402
from nemo_rl_attn_align.report.document import RunDescription, add_drift, collect  # noqa: E402
from nemo_rl_attn_align.report.report_plot import write_drift_plot  # noqa: E402

OUT = REPO / "docs" / "images" / "report-plot.png"
STEPS, SEED, SPIKE_AT = 200, 22, 137


def step_metrics(step: int, rng: random.Random) -> dict[str, float]:
    """One step's NeMo-RL metrics: a slow rise as the policy sharpens, noise, a spike at SPIKE_AT."""
    excess = 0.012 + 0.010 * step / STEPS + rng.gauss(0.0, 0.0025)
    excess += 0.045 * math.exp(-abs(step - SPIKE_AT) / 2.0)
    excess = max(excess, 0.002)
    kl = 0.8 * excess**2 * (1.0 + rng.gauss(0.0, 0.1))
    return {
        "token_mult_prob_error": 1.0 + excess,
        "gen_kl_error": kl,
        "policy_kl_error": kl * (1.0 + rng.gauss(0.0, 0.05)),
        "js_divergence_error": kl / 4.0 * (1.0 + rng.gauss(0.0, 0.05)),
    }


def example_report() -> dict:
    """The synthetic report document."""
    with tempfile.TemporaryDirectory() as empty:
        doc = collect(empty, AlignSettings(), RunDescription("grpo-qwen3-8b-example"))
    rng = random.Random(SEED)
    for step in range(1, STEPS + 1):
        add_drift(doc, step, step_metrics(step, rng))
    shape = "shape: 32 heads, 8 kv heads, head_dim 128, no window (model config.json); seq len 1024"
    doc["drift"]["attention_only"] = result(
        ESTIMATED,
        WHY_ESTIMATED,
        {"training": "flash", "rollout": "vllm-fa3", "dtype": "bf16", "assumes": [shape]},
        {
            "token_mult_prob_error": {"value": 1.0019, "low": 1.0012, "high": 1.0028},
            "gen_kl_error": {"value": 2.1e-6, "low": 1.4e-6, "high": 3.2e-6},
        },
    )
    return doc


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    path = write_drift_plot(example_report(), out)
    print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
