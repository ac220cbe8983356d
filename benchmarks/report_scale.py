"""Wall time and peak memory of `report` and `report --json` over a run of many workers (issue #40).

For each size N it writes a report directory as a run of N workers leaves it, through the
plugin's own writer (``report.store.write_worker_record``): 80% Megatron policy workers
(``policy-rank{i}``), 20% vLLM workers (``vllm-rank{leader}-worker{k}``, TP 4), each with its
contract and determinism probe. Then it runs ``report DIR`` and ``report --json DIR`` as fresh
processes (the console script of this interpreter's venv, output to /dev/null), each ``--runs``
times, and prints the median wall and CPU time, the largest peak RSS (``wait4``, the whole process:
interpreter start and imports included) and how each grows from one size to the next.
Target (issue #40): at 10,000 records, both commands in at most 2 s and 150 MB; the verdict is
printed for the wall and the CPU time, with the machine's load average (a shared machine's wall
time is the CPU time times the wait for a core).

``--details`` also writes each worker's host detail as the hooks write it (``peers``: every id of
its group), whose total size grows with the square of the group's size.

    python benchmarks/report_scale.py [--sizes 100 1000 10000] [--runs 3] [--details]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_rl_attn_align.binding.determinism_probe import probe  # noqa: E402
from nemo_rl_attn_align.report.store import write_worker_detail, write_worker_record  # noqa: E402
from nemo_rl_attn_align.vocab.worker_ids import rollout_peers, training_peers  # noqa: E402
from tests.contract_samples import full_contract  # noqa: E402

TARGET_S, TARGET_MB, TARGET_N = 2.0, 150.0, 10_000
ROLLOUT_TP = 4


def write_run(report_dir: Path, workers: int, details: bool) -> None:
    """The worker files a run of ``workers`` workers writes."""
    rollout = workers // 5
    groups = {
        "training": training_peers(workers - rollout),
        "rollout": rollout_peers(rollout - rollout % ROLLOUT_TP, ROLLOUT_TP) if rollout >= ROLLOUT_TP else [],
    }
    recorded = probe({}, torch_module=False)
    for side, ids in groups.items():
        for worker_id in ids:
            write_worker_record(report_dir, full_contract(side, worker_id), recorded, "bench-run")
            if details:
                detail = {"host": "bench", "stage": "engine_ready", "findings": [], "peers": ids}
                write_worker_detail(report_dir, side, worker_id, detail, "bench-run")


def console_script() -> list[str]:
    """This interpreter's console script (its venv's), else ``python -m nemo_rl_attn_align``."""
    script = Path(sysconfig.get_path("scripts")) / "nemo-rl-attn-align"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "nemo_rl_attn_align"]


def measure(cmd: list[str]) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in MB, exit code) of one fresh process."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    assert process.stderr is not None
    process.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--details", action="store_true", help="also write each worker's host detail")
    args = parser.parse_args()
    variants = {"report": [], "report --json": ["--json"]}
    rows, previous = [], None
    print(
        f"runs: {args.runs} each; host details: {'yes' if args.details else 'no'}; {' '.join(console_script())}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="attn-align-report-scale-") as folder:
            started = time.perf_counter()
            write_run(Path(folder), size, args.details)
            written = time.perf_counter() - started
            figures = {}
            for name, extra in variants.items():
                runs = [measure([*console_script(), "report", *extra, folder]) for _ in range(args.runs)]
                codes = {run[3] for run in runs}
                if codes - {0, 1}:
                    print(f"{name} over {size} records exited {sorted(codes)}")
                    return 1
                wall, cpu = (statistics.median(run[i] for run in runs) for i in (0, 1))
                figures[name] = (wall, cpu, max(run[2] for run in runs))
        growth = (
            "  ".join(
                f"x{figures[n][0] / previous[n][0]:.2f} s, x{figures[n][2] / previous[n][2]:.2f} MB" for n in variants
            )
            if previous
            else "-"
        )
        rows.append((size, figures))
        cells = "  ".join(f"{name}: {w:.2f} s ({cpu:.2f} s CPU) {mb:.0f} MB" for name, (w, cpu, mb) in figures.items())
        print(f"{size:>6} records (written in {written:.0f} s)  {cells}  growth: {growth}")
        previous = figures
    at_target = [figures for size, figures in rows if size == TARGET_N]
    if at_target:
        for clock, index in (("wall", 0), ("CPU", 1)):
            met = all(f[index] <= TARGET_S and f[2] <= TARGET_MB for f in at_target[0].values())
            print(
                f"target at {TARGET_N} records: <= {TARGET_S} s ({clock}) and <= {TARGET_MB:.0f} MB each: "
                f"{'met' if met else 'NOT met'} (load average now {os.getloadavg()[0]:.1f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
