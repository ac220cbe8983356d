"""Reference attention versus torch's scaled_dot_product_attention on the same CPU shapes.

Forward target: the reference within 1.5x of SDPA. Forward+backward (both through autograd, the
reference's canonical backward against SDPA's) has no target: its ratio is reported. Prints each
shape's best-of-N wall times and the ratios, from one run.
Usage: ``python benchmarks/reference_vs_sdpa.py [--threads 2] [--repeat 5]``.
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


def sdpa_thd(q, k, v):
    """Causal GQA SDPA on ``[S, H, D]`` tensors (as views ``[1, H, S, D]``), output ``[S, Hq, D]``."""
    qs, ks, vs = (x.transpose(0, 1)[None] for x in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)[0].transpose(
        0, 1
    )


def reference_out(q, k, v):
    return reference_attention(q, k, v)[0]


def forward_backward(attend, inputs, grad_out):
    """A step running ``attend(*leaves).backward(grad_out)`` on fresh leaves copied from ``inputs``."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]

    def step():
        for x in leaves:
            x.grad = None
        attend(*leaves).backward(grad_out)

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeat}, causal, GQA")
    print(
        f"{'shape':34s} {'dtype':9s} {'sdpa s':>8s} {'reference s':>12s} {'ratio':>6s}  target <= {TARGET}x"
        f"  {'sdpa f+b s':>10s} {'ref f+b s':>10s} {'f+b ratio':>9s}"
    )
    worst, worst_both = 0.0, 0.0
    for label, seq, heads, kv_heads, dim in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(seq, heads, dim, generator=gen).to(dtype)
            k = torch.randn(seq, kv_heads, dim, generator=gen).to(dtype)
            v = torch.randn(seq, kv_heads, dim, generator=gen).to(dtype)
            grad_out = torch.randn(seq, heads, dim, generator=gen).to(dtype)

            t_sdpa = best_of(lambda q=q, k=k, v=v: sdpa_thd(q, k, v), args.repeat)
            t_ref = best_of(lambda q=q, k=k, v=v: reference_attention(q, k, v), args.repeat)
            b_sdpa = best_of(forward_backward(sdpa_thd, (q, k, v), grad_out), args.repeat)
            b_ref = best_of(forward_backward(reference_out, (q, k, v), grad_out), args.repeat)
            ratio, ratio_both = t_ref / t_sdpa, b_ref / b_sdpa
            worst, worst_both = max(worst, ratio), max(worst_both, ratio_both)
            print(
                f"{label:34s} {str(dtype)[6:]:9s} {t_sdpa:8.3f} {t_ref:12.3f} {ratio:6.2f}  "
                f"{'ok' if ratio <= TARGET else 'OVER':15s}"
                f"  {b_sdpa:10.3f} {b_ref:10.3f} {ratio_both:9.2f}"
            )
    print(
        f"worst forward ratio {worst:.2f} (target {TARGET}); worst forward+backward ratio {worst_both:.2f} (no target)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
