"""What a training step costs the driver (target: flat, at most 1 ms a step at step 1, 10,000 and
100,000): the step's ``Logger.log_metrics(..., prefix="train")`` as the driver hook sees it, with
NeMo-RL's drift metrics and a ``loss``, through ``driver_report.train_metrics`` of a prepared run
(drift log append + the ``attention_align/`` numbers handed to the tracker).

    python benchmarks/step_cost.py [--steps 100000] [--window 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=200, help="steps timed around each reported step")
    args = parser.parse_args()
    from nemo_rl_attn_align.hosts import driver_report, nemo_rl_driver

    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "policy": {"precision": "bfloat16", "megatron_cfg": {"enabled": False}},
            "logger": {"log_dir": str(Path(tmp) / "logs" / "exp_001")},
            "attention_align": {"on_mismatch": "record", "attention_estimate": False},
        }
        run = nemo_rl_driver.prepare(cfg, "grpo")
        run.printer = lambda line: None
        run.at_setup()
        logged: list[dict] = []
        marks = sorted({1, 10_000, args.steps} & set(range(1, args.steps + 1)))
        timings: dict[int, list[float]] = {mark: [] for mark in marks}
        for step in range(1, args.steps + 1):
            metrics = {"loss": 0.5, "token_mult_prob_error": 1.0 + step * 1e-9, "gen_kl_error": 1e-4}
            start = time.perf_counter()
            driver_report.train_metrics(metrics, step, "train", logged.append)
            seconds = time.perf_counter() - start
            for mark in marks:
                if mark <= step < mark + args.window or (mark == args.steps and step > mark - args.window):
                    timings[mark].append(seconds)
            if len(logged) > 1:
                logged.clear()
        driver_report.end_of_training()
        log_bytes = sum(p.stat().st_size for p in Path(run.settings.report_dir, "drift").iterdir())
        report = Path(run.settings.report_dir) / "attention_align_report.json"
        print(f"steps: {args.steps}; drift log {log_bytes / 1e6:.1f} MB; report {report.stat().st_size / 1e6:.1f} MB")
        medians = {mark: statistics.median(t) * 1e3 for mark, t in timings.items() if t}
        for mark, ms in medians.items():
            print(f"step {mark:>7}: median {ms:.3f} ms a step over {len(timings[mark])} steps")
        first, last = medians[marks[0]], medians[marks[-1]]
        within = max(medians.values()) <= 1
        print(f"ratio step {marks[-1]} / step {marks[0]}: {last / first:.2f}; target <= 1 ms each: {within}")
        driver_report.stop()


if __name__ == "__main__":
    main()
