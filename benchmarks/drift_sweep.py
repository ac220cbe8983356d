"""The full default drift sweep at Qwen3-8B attention shapes, sequence 2048, on 2 cores.

Target: under 60 s. Prints the wall time, the time per engine run and the peak resident memory,
from one run. Engines: ``drift_shape.DEFAULT_TRAINING`` x vLLM's path on ``--gpu`` (``default_rollout``).
Usage: ``python benchmarks/drift_sweep.py [--threads 2] [--seq-len 2048] [--gpu sm90]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch

from nemo_rl_attn_align.drift import shape as drift_shape
from nemo_rl_attn_align.drift import sweep as drift
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

TARGET_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    replayed = {gpu: engine for (_, gpu), engine in drift_shape.ROLLOUT_REPLAYS.items()}
    parser.add_argument("--gpu", default=drift_shape.DEFAULT_GPU, choices=sorted(replayed))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = drift_shape.resolve_shape(
        read_recipe_facts({"policy": {"model_name": "Qwen/Qwen3-8B"}}),
        {"heads": None, "kv_heads": None, "head_dim": None, "window": None, "seq_len": args.seq_len},
    )
    training = drift.parse_materializers(list(drift_shape.DEFAULT_TRAINING), "--training")
    rollout = drift.parse_materializers(
        drift_shape.default_rollout(replayed[args.gpu], args.seq_len, None), "--rollout"
    )
    start = time.perf_counter()
    sweep = drift.Sweep(shape, list(drift_shape.DEFAULT_DTYPES), training, rollout, gpu=args.gpu)
    result = drift.run_sweep(sweep, drift.Progress(0, enabled=sys.stderr.isatty()))
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"shape: {shape.to_dict()}")
    print(
        f"threads={torch.get_num_threads()} dtypes={result['dtypes']} engines={len(set(training) | set(rollout))} "
        f"pairs={len(result['pairs'])}"
    )
    print(
        f"{'dtype':6s} {'engine':34s} {'seconds':>8s} {'max|d out| vs ref':>18s} {'max ulp(local) vs fp64':>23s} "
        f"{'>1 ulp vs fp64':>15s}"
    )
    for e in result["engines"]:
        print(
            f"{e['dtype']:6s} {e['engine']:34s} {e['seconds']:8.2f} {e['vs_reference']['out_abs_max']:18.3g} "
            f"{e['vs_fp64']['out_ulp_max']:23.2f} {100 * e['vs_fp64']['out_beyond_1ulp']:14.2f}%"
        )
    worst = max(result["pairs"], key=lambda p: p["logprob_abs_max"])
    print(
        f"largest pair drift: {worst['dtype']} {worst['training']} x {worst['rollout']}: "
        f"max|d logprob|={worst['logprob_abs_max']:.3g}, token_mult_prob_error={worst['token_mult_prob_error']:.6f}"
    )
    print(
        f"wall {wall:.1f} s (target < {TARGET_S:.0f} s: {'ok' if wall < TARGET_S else 'OVER'}), "
        f"peak RSS {peak_mib:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
