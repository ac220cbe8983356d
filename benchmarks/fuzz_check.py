"""Fuzz `nemo-rl-attn-align check` with generated configs, and run every hostile-file case.

Fuzz (default): N configs, each the packaged GRPO example with a random set of keys the rules and
settings read changed to values from ``tests/hostile_inputs.py`` (valid ones, near misses, wrong
types, broken structure), written as a YAML file or passed as Hydra overrides, run through the
CLI's in-process entry point (``nemo_rl_attn_align.cli.main``), every third one with ``--json``.
Counted: tracebacks and internal errors (exit 3), bad output (exit code outside {0,1,2}, a usage
error over more than one line, JSON a strict parser refuses, a finding over several lines) and wrong
accepts (exit 0 for a config NeMo-RL, Megatron or the documented attention_align schema reject).
Wrong accepts that exist only under NeMo-RL's truthiness of ``megatron_cfg.enabled`` (issue 9's
change) are counted apart.

Hostile files (``--hostile``): each case runs in a fresh subprocess; printed are its exit code,
stdout/stderr line count, wall and CPU time and peak RSS (``wait4``), the whole process included
(interpreter start and imports; the first row, checking the packaged example, is the reference),
and the wall time of the same command in this warm process (the refusal itself).
Target: exit 2 (or the stated outcome), one line, under 1 s of CPU time, under 100 MB.

    python benchmarks/fuzz_check.py --n 30000 --jobs 2 [--seed 0] [--out fuzz.json]
    python benchmarks/fuzz_check.py --hostile
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_rl_attn_align.config.example_recipes import default_example_path  # noqa: E402
from nemo_rl_attn_align.config.loader import load_config  # noqa: E402
from nemo_rl_attn_align.vocab.errors import UsageError  # noqa: E402
from tests import hostile_inputs as hi  # noqa: E402

EXAMPLE = default_example_path()


def _overrides_for(changes: dict) -> list[str]:
    out = []
    for key, value in changes.items():
        out.append(f"~{key}" if hi.is_unset(value) else f"++{key}={hi.hydra_literal(value)}")
    return out


def one_case(args: tuple[int, int]) -> dict:
    """Run generated config number ``index`` of seed ``seed``; the classification of its outcome
    (a failure of the harness itself is reported as such, apart from the plugin's)."""
    try:
        return _one_case(*args)
    except Exception as err:
        return {
            "index": args[1],
            "exit": "harness",
            "problems": [f"harness: {type(err).__name__}: {str(err)[:200]}"],
            "wrong_accept": None,
            "changes": {},
            "overrides": None,
        }


def _one_case(seed: int, index: int) -> dict:
    rng = random.Random(seed * 1_000_003 + index)
    changes = hi.random_mutation(rng)
    as_json = index % 3 == 0
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        if rng.random() < 0.3:
            path, overrides = EXAMPLE, _overrides_for(changes)
        else:
            cfg = copy.deepcopy(_BASE)
            for key, value in changes.items():
                hi.set_path(cfg, key, value)
            path, overrides = Path(tmp) / "c.yaml", []
            hi.write_config(path, cfg)
        outcome = hi.run_check(path, overrides, as_json=as_json)
        result = {
            "index": index,
            "exit": outcome.exit_code,
            "problems": outcome.problems,
            "wrong_accept": None,
            "changes": {k: repr(v)[:80] for k, v in changes.items()},
            "overrides": bool(overrides),
        }
        if outcome.exit_code == 0:
            try:
                resolved = load_config(path, overrides)
            except UsageError as err:
                result["problems"].append(f"exit 0 although the loader refuses: {err}")
                return result
            result["wrong_accept"] = hi.rejection(resolved)
    return result


_BASE: dict = {}


def _init() -> None:
    global _BASE
    _BASE = load_config(EXAMPLE)
    _BASE.pop("defaults", None)


def fuzz(n: int, seed: int, jobs: int) -> dict:
    start = time.perf_counter()
    exits, problems, wrong = Counter(), [], []
    with multiprocessing.Pool(jobs, initializer=_init) as pool:
        for result in pool.imap_unordered(one_case, ((seed, i) for i in range(n)), chunksize=64):
            exits[result["exit"]] += 1
            if result["problems"]:
                problems.append(result)
            if result["wrong_accept"]:
                wrong.append(result)
    elapsed = time.perf_counter() - start
    tracebacks = [p for p in problems if any(x.startswith(("traceback", "internal error")) for x in p["problems"])]
    harness = [p for p in problems if p["exit"] == "harness"]
    problems = [p for p in problems if p["exit"] != "harness"]
    summary = {
        "configs": n,
        "seed": seed,
        "seconds": round(elapsed, 1),
        "exit_codes": {str(k): v for k, v in sorted(exits.items(), key=str)},
        "tracebacks": len(tracebacks),
        "output_problems": len(problems) - len(tracebacks),
        "wrong_accepts": len(wrong),
        "harness_failures": len(harness),
        "examples": {"problems": problems[:20], "wrong_accepts": wrong[:20]},
    }
    print(f"fuzz: {n} configs (seed {seed}) in {elapsed:.0f} s; exit codes {summary['exit_codes']}")
    print(
        f"  tracebacks: {summary['tracebacks']}; other output problems: {summary['output_problems']}; "
        f"wrong accepts: {summary['wrong_accepts']}; "
        f"harness failures: {len(harness)}"
    )
    for item in (problems + wrong)[:10]:
        print(f"  e.g. #{item['index']}: {item['problems'] or item['wrong_accept']} <- {item['changes']}")
    return summary


# --- hostile files ------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "nemo_rl_attn_align"]


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _write_pieces(path: Path, pieces) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for piece in pieces:
            handle.write(piece)


def _record(**extra) -> str:
    return json.dumps({"kind": "nemo-rl-attn-align/host-detail", "side": "training", "worker_id": "w", **extra})


def hostile_cases(tmp: Path) -> list[tuple[str, list[str], dict]]:
    """(name, argv, expectation) for every hostile input of issue 12; files are made under ``tmp``."""
    ex = str(EXAMPLE)
    (tmp / "loop_a").symlink_to(tmp / "loop_b")
    (tmp / "loop_b").symlink_to(tmp / "loop_a")
    os.mkfifo(tmp / "fifo")
    (tmp / "afile").write_text("x")
    # Big files are written in pieces: this process must stay small, since a child's peak RSS
    # (wait4) starts from the parent's size at fork.
    _write_pieces(tmp / "string50m.yaml", ["a: '", *["x" * (1 << 20)] * 50, "'\n"])
    _write_pieces(
        tmp / "keys4m.yaml",
        ("".join(f"k{i}: {i}\n" for i in range(j, j + 100_000)) for j in range(0, 4_200_000, 100_000)),
    )
    _write_pieces(tmp / "report_big.json", ["[", *["0," * (1 << 20)] * 40, "0]"])
    files = {
        "bomb6.yaml": _alias_bomb(6),
        "bomb9.yaml": _alias_bomb(9),
        "deep.yaml": "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "deep_block.yaml": "".join(" " * i + f"k{i}:\n" for i in range(2000)),
        "deep_block_small.yaml": "".join(" " * i + f"k{i}:\n" for i in range(200)),
        "recursive.yaml": "a: &a [*a]\n",
        "newline_key.yaml": f'defaults: {ex}\nattention_align:\n  "bad\\nkey": 1\n',
        "huge_value.yaml": f"defaults: {ex}\nattention_align:\n  on_mismatch: '{'v' * 200_000}'\n",
        "report_v1.0.json": json.dumps({"kind": "nemo-rl-attn-align/report", "schema_version": 1.0}),
        "report_true.json": json.dumps({"kind": "nemo-rl-attn-align/report", "schema_version": True}),
        "report_deep.json": "[" * 500_000 + "]" * 500_000,
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    records = tmp / "records"
    for folder in ("workers", "hosts"):
        (records / folder).mkdir(parents=True)
    (records / "workers" / "training--deep.json").write_text("[" * 500_000 + "]" * 500_000)
    (records / "hosts" / "training--peers.json").write_text(_record(peers=5))
    (records / "hosts" / "training--findings7.json").write_text(_record(findings=7))
    (records / "hosts" / "training--oops.json").write_text(_record(findings="oops"))
    os.mkfifo(records / "workers" / "training--fifo.json")
    (records / "workers" / "training--zero.json").symlink_to("/dev/zero")
    long_name = "c" * 300 + ".yaml"
    bad = {"exit": 2, "lines": 1}
    return [
        ("reference: check the packaged example", [*CLI, "check", ex], {"exit": 0}),
        ("check: symlink loop as CONFIG", [*CLI, "check", str(tmp / "loop_a")], bad),
        ("check: path component of 300 chars", [*CLI, "check", str(tmp / long_name)], bad),
        ("check: /dev/zero", [*CLI, "check", "/dev/zero"], bad),
        ("check: FIFO", [*CLI, "check", str(tmp / "fifo")], bad),
        ("check: a directory", [*CLI, "check", str(tmp)], bad),
        ("check: alias bomb, 6 levels (1.3 KB)", [*CLI, "check", str(tmp / "bomb6.yaml")], bad),
        ("check: alias bomb, 9 levels", [*CLI, "check", str(tmp / "bomb9.yaml")], bad),
        ("check: recursive alias", [*CLI, "check", str(tmp / "recursive.yaml")], bad),
        ("check: 50 MB string", [*CLI, "check", str(tmp / "string50m.yaml")], bad),
        ("check: 4.2 M keys", [*CLI, "check", str(tmp / "keys4m.yaml")], bad),
        ("check: 100k-deep flow nesting", [*CLI, "check", str(tmp / "deep.yaml")], bad),
        ("check: 2000-deep block nesting (2 MB)", [*CLI, "check", str(tmp / "deep_block.yaml")], bad),
        ("check: 200-deep block nesting (20 KB)", [*CLI, "check", str(tmp / "deep_block_small.yaml")], bad),
        ("check: override key 600 levels deep", [*CLI, "check", ex, "++" + ".".join(["a"] * 600) + "=1"], bad),
        ("check: override value 5000 brackets deep", [*CLI, "check", ex, "++a=" + "[" * 5000 + "]" * 5000], bad),
        ("check: key with a newline", [*CLI, "check", str(tmp / "newline_key.yaml")], bad),
        ("check: 200 KB value", [*CLI, "check", str(tmp / "huge_value.yaml")], bad),
        (
            "check --json: 200 KB value",
            [*CLI, "check", "--json", str(tmp / "huge_value.yaml")],
            {"exit": 2, "lines": 2},
        ),
        (
            "check: unknown cp_comm_type with CP 2",
            [
                *CLI,
                "check",
                ex,
                "++policy.megatron_cfg.context_parallel_size=2",
                "++policy.megatron_cfg.model_overrides.cp_comm_type=bogus",
            ],
            {"exit": 1},
        ),
        ("report: /dev/zero", [*CLI, "report", "/dev/zero"], bad),
        ("report: FIFO", [*CLI, "report", str(tmp / "fifo")], bad),
        ("report: symlink loop", [*CLI, "report", str(tmp / "loop_a")], bad),
        ("report: path component of 300 chars", [*CLI, "report", str(tmp / ("r" * 300))], bad),
        ("report: schema_version 1.0", [*CLI, "report", str(tmp / "report_v1.0.json")], bad),
        ("report: schema_version true", [*CLI, "report", str(tmp / "report_true.json")], bad),
        ("report: JSON 500k levels deep", [*CLI, "report", str(tmp / "report_deep.json")], bad),
        ("report: 80 MB report", [*CLI, "report", str(tmp / "report_big.json")], bad),
        ("report: bad records listed as unreadable", [*CLI, "report", str(records)], {"exit": 0, "unreadable": 6}),
        (
            "drift: --out under a file",
            [*CLI, "drift", "--heads", "2", "--head-dim", "8", "--out", str(tmp / "afile" / "sub")],
            bad,
        ),
        (
            "drift: --out is a file",
            [*CLI, "drift", "--heads", "2", "--head-dim", "8", "--out", str(tmp / "afile")],
            bad,
        ),
        (
            "drift: --out uncreatable (/proc)",
            [*CLI, "drift", "--heads", "2", "--head-dim", "8", "--out", "/proc/x/y"],
            bad,
        ),
        (
            "drift: --out component of 300 chars",
            [*CLI, "drift", "--heads", "2", "--head-dim", "8", "--out", str(tmp / ("o" * 300))],
            bad,
        ),
    ]


def run_measured(argv: list[str], cwd: Path, env: dict, preexec_fn=None) -> tuple[int, str, str, float, float, float]:
    """``argv`` as a process: exit code, stdout, stderr, wall seconds, peak RSS in MB and CPU seconds
    (``wait4``); ``preexec_fn`` runs in the child before it starts ``argv``."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd, env=env, preexec_fn=preexec_fn)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            proc.returncode = 0  # reaped by wait4
        elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        return (
            code,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            elapsed,
            usage.ru_maxrss / 1024,
            cpu,
        )


def _in_process_ms(argv: list[str]) -> float:
    """Wall time of the same command through ``nemo_rl_attn_align.cli.main`` in this (warm)
    process: the cost of the refusal itself, without interpreter start and imports."""
    import contextlib
    import io

    from nemo_rl_attn_align.cli import main as cli_main

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli_main(argv[len(CLI) :])
        except SystemExit:
            pass
    return (time.perf_counter() - start) * 1e3


def hostile(timeout_note: float = 1.0, memory_mb: float = 100.0) -> list[dict]:
    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        tmp_path = Path(tmp)
        baseline = run_measured([sys.executable, "-c", "import nemo_rl_attn_align.cli"], tmp_path, env)
        cases = hostile_cases(tmp_path)
        # Subprocesses first: a child's peak RSS (wait4) starts from this process's size at fork.
        measured = [run_measured(argv, tmp_path, env) for _, argv, _ in cases]
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            _in_process_ms(cases[0][1])  # warm the imports once
            in_process_ms = [_in_process_ms(argv) for _, argv, _ in cases]
        finally:
            os.chdir(cwd)
        for (name, _argv, want), (code, out, err, seconds, mb, cpu), in_process in zip(
            cases, measured, in_process_ms, strict=True
        ):
            text = out + err
            lines = text.count("\n")
            ok = code == want["exit"] and ("lines" not in want or lines == want["lines"]) and "Traceback" not in text
            if "unreadable" in want:
                ok = ok and f"unreadable: {want['unreadable']}" in text
            ok = ok and cpu < timeout_note and mb < memory_mb  # CPU time: wall time depends on the machine's load
            rows.append(
                {
                    "case": name,
                    "exit": code,
                    "lines": lines,
                    "seconds": round(seconds, 3),
                    "cpu_s": round(cpu, 3),
                    "in_process_ms": round(in_process, 1),
                    "peak_mb": round(mb, 1),
                    "ok": ok,
                    "output": (err or out).strip().splitlines()[0][:160] if text.strip() else "",
                }
            )
        print(
            f"baseline (python -c 'import nemo_rl_attn_align.cli'): {baseline[3]:.3f} s wall, "
            f"{baseline[5]:.3f} s CPU, {baseline[4]:.1f} MB"
        )
    print(f"{'case':<46} {'exit':>4} {'lines':>5} {'wall s':>6} {'cpu s':>6} {'in-proc ms':>10} {'MB':>6}  ok  output")
    for r in rows:
        print(
            f"{r['case']:<46} {r['exit']:>4} {r['lines']:>5} {r['seconds']:>6.3f} {r['cpu_s']:>6.3f} "
            f"{r['in_process_ms']:>10.1f} {r['peak_mb']:>6.1f}  "
            f"{'yes' if r['ok'] else 'NO '} {r['output']}"
        )
    print(
        f"{sum(r['ok'] for r in rows)}/{len(rows)} cases as expected "
        f"(exit, one line, < {timeout_note} s CPU, < {memory_mb} MB); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30_000, help="generated configs (default 30000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--hostile", action="store_true", help="run the hostile-file cases instead of the fuzz")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    result = {"hostile": hostile()} if args.hostile else fuzz(args.n, args.seed, args.jobs)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str))
    if args.hostile:
        return 0 if all(r["ok"] for r in result["hostile"]) else 1
    return 0 if not (result["tracebacks"] or result["output_problems"] or result["wrong_accepts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
