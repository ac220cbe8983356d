"""Run ``nemo-rl-attn-align check`` over generated hostile model directories (issue #40) and print the
worst case's time and memory.

The models come from ``tests/hostile_models.py`` (random config.json values, types, sizes and depths;
files that are not files; tokenizer files missing, unreadable, huge or sparse; broken hub-cache refs
and blobs; recipe overrides of the model's values), each pointed at by ``policy.model_name`` on the
packaged GRPO example. Every case must end with no traceback, exit 2 and one line where its input is
unusable, exit 0 or 1 where it is usable.

In-process (all N, ``--jobs`` worker processes through the CLI's entry point): the CPU and wall time
of each case, and each worker's peak RSS over all its cases (an upper bound of every case's, the
interpreter and its imports included). As real processes (``--processes`` cases: the slowest of the
in-process run, then a random sample): each ``check`` process's wall and CPU time and peak RSS
(``wait4``), interpreter start and imports included. Runs as root drop CAP_DAC_OVERRIDE in the
workers and children, so files of mode 000 are unreadable to them as to any user.
Target: every case under 1 s of CPU time and 100 MB.

    python benchmarks/hostile_models.py [--n 10000] [--jobs 2] [--processes 200] [--seed 0] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fuzz_check import CLI, run_measured  # noqa: E402
from nemo_rl_attn_align.config.example_recipes import default_example_path  # noqa: E402
from tests import hostile_inputs as hi  # noqa: E402
from tests import hostile_models as hm  # noqa: E402

EXAMPLE = default_example_path()
CPU_LIMIT_S, MEMORY_LIMIT_MB = 1.0, 100.0


def verdict(case: hm.ModelCase, code, stdout: str, stderr: str, exception=None) -> list[str]:
    """What is wrong with one case's outcome (empty: as expected)."""
    if exception is not None or "Traceback" in stderr:
        return [f"traceback: {exception!r}"[:200] if exception is not None else "traceback"]
    if case.unusable is not None and code != 2:
        return [f"exit {code} for an unusable input ({case.unusable})"]
    if case.unusable is not None and (stderr.count("\n") != 1 or stdout):
        return [f"the usage error is not one line: {stderr[:200]!r}"]
    if case.unusable is None and code not in (0, 1):
        return [f"exit {code} for a usable input: {(stderr or stdout)[-200:]!r}"]
    return []


def _init_worker(hub: str) -> None:
    hm.without_file_permission_override()
    os.environ["HF_HUB_CACHE"] = hub
    hi.run_check(EXAMPLE, [])  # imports warm before any case is timed


def _in_process(case: hm.ModelCase) -> dict:
    cpu, wall = time.process_time(), time.perf_counter()
    outcome = hi.run_check(EXAMPLE, case.overrides)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    problems = verdict(case, outcome.exit_code, outcome.stdout, outcome.stderr, outcome.exception)
    return {
        "label": case.label,
        "exit": outcome.exit_code,
        "cpu_s": cpu,
        "wall_s": wall,
        "problems": problems,
        "line": (outcome.stderr or "").strip()[:160],
        "worker": os.getpid(),
        "worker_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def in_process(cases: list[hm.ModelCase], hub: Path, jobs: int) -> list[dict]:
    with multiprocessing.Pool(jobs, initializer=_init_worker, initargs=(str(hub),)) as pool:
        return list(pool.imap(_in_process, cases, chunksize=16))


def as_processes(cases: list[hm.ModelCase], hub: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(hub)}
    rows = []
    for case in cases:
        argv = [*CLI, "check", str(EXAMPLE), *case.overrides]
        code, out, err, wall, mb, cpu = run_measured(argv, ROOT, env, preexec_fn=hm.without_file_permission_override)
        rows.append(
            {"label": case.label, "exit": code, "wall_s": wall, "cpu_s": cpu, "peak_mb": mb,
             "problems": verdict(case, code, out, err)}
        )  # fmt: skip
    return rows


def _worst(rows: list[dict], key: str) -> dict:
    return max(rows, key=lambda row: row[key])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="generated models (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--processes", type=int, default=200, help="cases also run as real processes")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-models-") as folder:
        root = Path(folder)
        start = time.perf_counter()
        cases = hm.write_cases(root, args.n, args.seed)
        written = time.perf_counter() - start
        mode_000 = sum(case.mode_000 for case in cases)
        start = time.perf_counter()
        rows = in_process(cases, root / "hub", args.jobs)
        elapsed = time.perf_counter() - start
        slowest = sorted(range(len(rows)), key=lambda i: rows[i]["cpu_s"], reverse=True)[: args.processes // 4]
        rest = [i for i in range(len(rows)) if i not in set(slowest)]
        sample = slowest + random.Random(args.seed).sample(rest, min(len(rest), args.processes - len(slowest)))
        processes = as_processes([cases[i] for i in sample], root / "hub")
    exits = Counter(str(row["exit"]) for row in rows)
    unusable = sum(case.unusable is not None for case in cases)
    bad = [row for row in rows + processes if row["problems"]]
    peaks = {row["worker"]: row["worker_peak_mb"] for row in rows}
    cpu, wall = _worst(rows, "cpu_s"), _worst(rows, "wall_s")
    p_cpu, p_wall, p_mb = _worst(processes, "cpu_s"), _worst(processes, "wall_s"), _worst(processes, "peak_mb")
    print(
        f"{args.n} hostile models (seed {args.seed}; {unusable} unusable, {mode_000} with a file of mode 000) "
        f"written in {written:.1f} s, checked in {elapsed:.0f} s with {args.jobs} workers; exit codes {dict(exits)}"
    )
    print(f"  in-process: worst CPU {cpu['cpu_s'] * 1e3:.0f} ms ({cpu['label']})")
    print(f"              worst wall {wall['wall_s'] * 1e3:.0f} ms ({wall['label']})")
    print(f"              workers' peak RSS over all their cases: {', '.join(f'{mb:.1f}' for mb in peaks.values())} MB")
    print(f"  {len(processes)} as processes (the {len(slowest)} slowest, then a random sample), each whole:")
    print(f"              worst CPU {p_cpu['cpu_s'] * 1e3:.0f} ms ({p_cpu['label']})")
    print(f"              worst wall {p_wall['wall_s'] * 1e3:.0f} ms ({p_wall['label']})")
    print(f"              worst peak RSS {p_mb['peak_mb']:.1f} MB ({p_mb['label']})")
    print(f"  outcomes not as expected: {len(bad)}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for row in bad[:10]:
        print(f"    {row['label']}: {row['problems']}")
    worst_cpu = max(cpu["cpu_s"], p_cpu["cpu_s"])
    worst_mb = max([p_mb["peak_mb"], *peaks.values()])
    ok = not bad and worst_cpu < CPU_LIMIT_S and worst_mb < MEMORY_LIMIT_MB
    target = f"< {CPU_LIMIT_S:g} s CPU and < {MEMORY_LIMIT_MB:g} MB each, as expected"
    print(f"  target ({target}): {'met' if ok else 'NOT met'}")
    if args.out:
        args.out.write_text(json.dumps({"in_process": rows, "processes": processes}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
