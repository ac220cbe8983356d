"""What the plugin adds to every interpreter start (target: under 2 ms on ``python -c pass``).

Two fresh stdlib-only venvs: ``bare`` and ``plugin``, whose site-packages holds what an install
of this package puts there (a path entry for the package and ``nemo_rl_attn_align.pth``), with
bytecode compiled once (into a temporary ``PYTHONPYCACHEPREFIX``) as pip does at install. It times
``python -c pass`` in both, interleaved, plus the plugin venv with ``NEMO_RL_ATTN_ALIGN=0``, and
reads ``python -X importtime`` for the plugin's own modules.

    python benchmarks/startup_overhead.py [--runs 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_venv(path: Path, with_plugin: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    if with_plugin:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "_nemo_rl_attn_align_src.pth").write_text(f"{REPO}\n")  # sorts before the import line's file
        Path(site, "nemo_rl_attn_align.pth").write_text((REPO / "nemo_rl_attn_align.pth").read_text())
    return python


def wall_ms(python: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - start) * 1000


def plugin_import_us(python: Path, env: dict) -> dict[str, int]:
    out = subprocess.run(
        [str(python), "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True, check=True
    ).stderr
    selfs = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2].startswith("nemo_rl_attn_align"):
            selfs[parts[2]] = int(parts[0].split(":")[-1])
    return selfs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    drop = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("NEMO_RL_ATTN_ALIGN")}
    with tempfile.TemporaryDirectory() as tmp:
        # bytecode as an installed package has it (pip compiles at install), kept out of the tree
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        off = {**env, "NEMO_RL_ATTN_ALIGN": "0"}
        bare = make_venv(Path(tmp, "bare"), with_plugin=False)
        plugin = make_venv(Path(tmp, "plugin"), with_plugin=True)
        for python in (bare, plugin):  # warm the page cache and write .pyc files
            for _ in range(3):
                wall_ms(python, env)
        child = {**env, "PYTHONPATH": str(REPO / "nemo_rl_attn_align" / "_shim")}  # what children inherit
        times = {"bare": [], "plugin": [], "plugin, child (shim on PYTHONPATH)": [], "plugin, NEMO_RL_ATTN_ALIGN=0": []}
        for _ in range(args.runs):
            times["bare"].append(wall_ms(bare, env))
            times["plugin"].append(wall_ms(plugin, env))
            times["plugin, child (shim on PYTHONPATH)"].append(wall_ms(plugin, child))
            times["plugin, NEMO_RL_ATTN_ALIGN=0"].append(wall_ms(plugin, off))
        imports = plugin_import_us(plugin, env)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"python -c pass, median of {args.runs} runs each (interleaved):")
    for name, value in medians.items():
        print(f"  {name:36s} {value:7.2f} ms  (+{value - medians['bare']:.2f} ms, {value / medians['bare']:.3f}x)")
    added = medians["plugin"] - medians["bare"]
    print(f"added by the plugin to python -c pass: {added:.2f} ms (target < 2 ms: {'met' if added < 2 else 'NOT met'})")
    print("python -X importtime, self time of the plugin's modules at start:")
    for name, us in imports.items():
        print(f"  {name:40s} {us:6d} us")
    print(f"  {'total':40s} {sum(imports.values()):6d} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
