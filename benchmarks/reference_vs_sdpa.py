"""Reference attention versus torch's scaled_dot_product_attention on the same CPU shapes.

Target: the reference within 1.5x of SDPA. Prints each shape's best-of-N wall time for both and
the ratio, from one run. Usage: ``python benchmarks/reference_vs_sdpa.py [--threads 2] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from nemo_rl_attn_align.reference.attention import reference_attention

#: (label, seq, heads, kv_heads, head_dim)
SHAPES = [
    ("Qwen3-8B layer, 2048 tokens", 2048, 32, 8, 128),
    ("Qwen2.5-1.5B layer, 2048 tokens", 2048, 12, 2, 128),
    ("Llama-3.2-1B layer, 1024 tokens", 1024, 32, 8, 64),
]
TARGET = 1.5


def best_of(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeat}, causal, GQA")
    print(f"{'shape':34s} {'dtype':9s} {'sdpa s':>8s} {'reference s':>12s} {'ratio':>6s}  target <= {TARGET}x")
    worst = 0.0
    for label, seq, heads, kv_heads, dim in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(seq, heads, dim, generator=gen).to(dtype)
            k = torch.randn(seq, kv_heads, dim, generator=gen).to(dtype)
            v = torch.randn(seq, kv_heads, dim, generator=gen).to(dtype)
            qs, ks, vs = (x.transpose(0, 1)[None] for x in (q, k, v))      # [1, H, S, D]
            t_sdpa = best_of(lambda: sdpa(qs, ks, vs, is_causal=True, enable_gqa=True), args.repeat)
            t_ref = best_of(lambda: reference_attention(q, k, v), args.repeat)
            ratio = t_ref / t_sdpa
            worst = max(worst, ratio)
            print(f"{label:34s} {str(dtype)[6:]:9s} {t_sdpa:8.3f} {t_ref:12.3f} {ratio:6.2f}  {'ok' if ratio <= TARGET else 'OVER'}")
    print(f"worst ratio {worst:.2f} (target {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
