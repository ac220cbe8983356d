"""Wall time of `nemo-rl-attn-align check` on the packaged example against `python -c pass`.

Runs them as fresh subprocesses, interleaved, with a third command for the floor: the interpreter
plus OmegaConf and PyYAML, which ``check`` needs to read a recipe exactly as NeMo-RL does. Prints
the medians, the differences and the ratios from this one run. Target (issue #31): check in at
most 2x the floor's median (issue #13's 100 ms was set before the kernel predictions and the
two-core machines this runs on).

    python benchmarks/check_walltime.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from nemo_rl_attn_align.config.example_recipes import default_example_path

EXAMPLE = default_example_path()


def console_script() -> list[str]:
    """The console script of this interpreter's environment (what a user of that venv runs), not the
    first one on PATH, which may belong to another interpreter or be a pyenv shim."""
    script = Path(sysconfig.get_path("scripts")) / ("nemo-rl-attn-align" + (".exe" if os.name == "nt" else ""))
    return [str(script)] if script.is_file() else [sys.executable, "-m", "nemo_rl_attn_align"]


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    check_cmd = [*console_script(), "check", str(EXAMPLE)]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import omegaconf": [sys.executable, "-c", "import omegaconf, yaml"],
        "check (example)": check_cmd,
    }
    times = {name: [] for name in commands}
    warm = subprocess.run(check_cmd, capture_output=True, text=True)  # warms the file cache once
    if warm.returncode != 0:
        print(f"check exited {warm.returncode} on {EXAMPLE}, nothing to time: {warm.stderr.strip()[-300:]}")
        return 1
    for _ in range(args.runs):
        for name, cmd in commands.items():
            times[name].append(wall(cmd))
    base, floor, check = (statistics.median(times[n]) for n in commands)
    print(f"runs: {args.runs} each, interleaved; command: {' '.join(check_cmd)}")
    for name in commands:
        print(
            f"{name:>16}: median {statistics.median(times[name]) * 1e3:7.1f} ms  min {min(times[name]) * 1e3:7.1f} ms"
        )
    print(f"{'check - pass':>16}: {(check - base) * 1e3:7.1f} ms   ratio check/pass: {check / base:.1f}x")
    print(
        f"{'check - floor':>16}: {(check - floor) * 1e3:7.1f} ms   (the floor: interpreter + omegaconf + yaml imports)"
    )
    print(f"{'check / floor':>16}: {check / floor:7.2f}x")
    print(f"target (issue #31): check <= 2x the floor, median -> {'met' if check <= 2 * floor else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
