"""Forward and forward+backward TFLOP/s of each Transformer Engine attention backend and of the reference, on one GPU.

Qwen3-8B attention shapes by default (32 query heads, 8 KV heads, head dim 128), BF16, causal,
batch 1, sequence 1k/4k/8k. Each TE backend runs in its own process with only its NVTE switch on
(TE caches its backend choice per process), through TE's ``DotProductAttention`` in bshd, and the
backend TE really selected is read back (``hosts.te_readback.observe``) and printed next to the
figures. The reference (``reference.attention.reference_attention``, FP32 canonical-order blocks in
plain torch ops, TF32 off, not a fused kernel) runs in packed thd with its canonical backward, so
its row has forward and forward+backward figures like the TE rows. Every row is timed the same way:
the forward on inputs that require grad, and forward+backward against a fixed random ``dO``.

FLOPs follow FlashAttention's benchmark convention (Dao-AILab/flash-attention,
``benchmarks/benchmark_flash_attention.py``, ``flops()``): forward ``4·b·s²·h·d``, halved when
causal, with ``h`` the query heads; backward 2.5x the forward, so forward+backward is 3.5x.
Times are CUDA-event medians of ``--iters`` runs after ``--warmup`` runs. The fraction is of the
GPU's dense BF16 tensor-core peak (``DENSE_BF16_PEAK``, NVIDIA datasheet figures without
sparsity); an unknown GPU gets no fraction unless ``--peak-tflops`` is given.

    python benchmarks/attention_backends.py [--seqs 1024 4096 8192] [--out attention_backends.json]

Exit codes: 0 every row measured, 1 some backend failed or TE ran another backend than asked,
2 no CUDA or no Transformer Engine here (one line on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's package, installed or not (stdlib-only modules below)

from nemo_rl_attn_align.preflight.backend import (  # noqa: E402 (after sys.path.insert: this checkout's package)
    NVTE_BY_BACKEND,
    TE_CLASS_BY_BACKEND,
)

TE_BACKENDS = ("flash", "fused", "unfused")
BACKENDS = (*TE_BACKENDS, "reference")
#: (substring of torch.cuda.get_device_name(), dense BF16 TFLOP/s), first match wins: specific names first.
DENSE_BF16_PEAK = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200 NVL", 835.0),
    ("GH200", 989.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)
FWD_BWD_FACTOR = 3.5  # forward + 2.5x forward for the backward


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool = True, mode: str = "fwd") -> float:
    """FLOPs of one attention call, FlashAttention's convention (``mode``: fwd, bwd, fwd_bwd)."""
    factors = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": FWD_BWD_FACTOR}
    if mode not in factors:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(factors)}")
    forward = 4.0 * batch * seq * seq * heads * head_dim / (2 if causal else 1)
    return forward * factors[mode]


def dense_bf16_peak(device_name: str) -> tuple[float | None, str]:
    """The dense BF16 peak (TFLOP/s) for ``device_name`` and what it was matched on; None if unknown."""
    for key, peak in DENSE_BF16_PEAK:
        if key.lower() in device_name.lower():
            return peak, f"{key}: {peak:g} TFLOP/s dense BF16 (NVIDIA datasheet, no sparsity)"
    return None, f"dense BF16 peak unknown for {device_name!r}: fraction omitted (pass --peak-tflops)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 8192], help="sequence lengths")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="timed runs per figure (median)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense BF16 peak, for a GPU not in the table")
    parser.add_argument("--out", type=Path, default=Path("attention_backends.json"), help="JSON results")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)  # one backend, in this process
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("batch", "heads", "kv_heads", "head_dim", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if any(s < 1 for s in args.seqs):
        parser.error(f"--seqs must be positive, got {args.seqs}")
    if args.worker and not args.worker_out:
        parser.error("--worker needs --worker-out")
    if args.heads % args.kv_heads:
        parser.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    return args


def missing_requirements(backends: Sequence[str]) -> str | None:
    """Why this machine cannot run the benchmark (one line), or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False): run it on a GPU node"
    if set(backends) & set(TE_BACKENDS) and importlib.util.find_spec("transformer_engine") is None:
        return (
            "Transformer Engine is not installed: pip install transformer_engine[pytorch], or pass --backends reference"
        )
    return None


# --- one backend, in its own process ---------------------------------------------------------------


def cuda_median_ms(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median CUDA-event time of ``fn`` in milliseconds."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def reference_attend(batch: int, seq: int) -> Callable:
    """The reference as a bshd attention: q ``[b, s, Hq, D]``, k/v ``[b, s, Hkv, D]`` -> ``[b, s, Hq*D]``."""
    import torch

    from nemo_rl_attn_align.reference.attention import reference_attention
    from nemo_rl_attn_align.reference.causal import Causal

    def attend(q, k, v):
        packed = [x.reshape(batch * seq, *x.shape[2:]) for x in (q, k, v)]  # thd, one sequence per batch row
        cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=q.device)
        return reference_attention(*packed, Causal(cu_seqlens_q=cu, cu_seqlens_k=cu))[0].view(batch, seq, -1)

    return attend


def timed_steps(attend: Callable, inputs: Sequence[Any], grad_out) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``(forward, forward_backward)`` of ``attend`` on ``inputs`` (leaves that require grad)."""

    def forward_backward():
        for x in inputs:
            x.grad = None
        attend(*inputs).backward(grad_out)

    return (lambda: attend(*inputs)), forward_backward


def measure(backend: str, args: argparse.Namespace, seq: int) -> dict[str, Any]:
    """Times (ms) of one backend at one sequence length, and what TE really ran."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seq)
    shape = lambda h: (args.batch, seq, h, args.head_dim)  # noqa: E731 - bshd
    q, k, v = (
        torch.randn(shape(h), device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
        for h in (args.heads, args.kv_heads, args.kv_heads)
    )
    grad_out = torch.randn(
        args.batch, seq, args.heads * args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    if backend == "reference":
        attend, observe = reference_attend(args.batch, seq), (lambda: {})
    else:
        import transformer_engine.pytorch as te

        from nemo_rl_attn_align.hosts import te_readback

        attend = te.DotProductAttention(
            args.heads, args.head_dim, num_gqa_groups=args.kv_heads, qkv_format="bshd", attn_mask_type="causal"
        )
        observe = lambda: te_readback.observe([attend])  # noqa: E731
    forward, forward_backward = timed_steps(attend, (q, k, v), grad_out)
    fwd = cuda_median_ms(forward, args.warmup, args.iters)
    selected = observe()  # TE's choice is known after the first forward
    both = cuda_median_ms(forward_backward, args.warmup, args.iters)
    return {
        "fwd_ms": fwd,
        "fwd_bwd_ms": both,
        "te_selected": selected.get("backend"),
        "detail": selected.get("detail"),
        "note": "",
    }


def run_worker(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every sequence length for one backend; a failure is recorded for its row, not raised."""
    import torch

    torch.cuda.set_device(0)
    rows = {}
    for seq in args.seqs:
        try:
            rows[str(seq)] = measure(backend, args, seq)
        except Exception as exc:
            rows[str(seq)] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
        torch.cuda.empty_cache()
    return {
        "backend": backend,
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "rows": rows,
    }


def spawn(backend: str, argv: Sequence[str]) -> dict[str, Any]:
    """Run one backend in a fresh process with only its NVTE switch on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTE_")}
    env.update(NVTE_BY_BACKEND.get(backend, {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "worker.json"
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", backend, "--worker-out", str(out)],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"backend": backend, "error": f"worker exited {proc.returncode}: {tail[0][:300]}", "rows": {}}
        return json.loads(out.read_text())


# --- results ------------------------------------------------------------------------------------


def build_rows(results: Sequence[dict[str, Any]], args: argparse.Namespace, peak: float | None) -> list[dict[str, Any]]:
    """One row per (backend, sequence): times, TFLOP/s, fraction of the dense peak, what TE ran."""
    rows = []
    for result in results:
        backend = result["backend"]
        for seq in args.seqs:
            measured = result.get("rows", {}).get(str(seq), {"error": result.get("error", "not measured")})
            fwd_flops = attention_flops(args.batch, seq, args.heads, args.head_dim, True, "fwd")
            row: dict[str, Any] = {
                "backend": backend,
                "seq": seq,
                "fwd_ms": measured.get("fwd_ms"),
                "fwd_bwd_ms": measured.get("fwd_bwd_ms"),
                "te_selected": measured.get("te_selected"),
                "error": measured.get("error"),
                "note": measured.get("note", ""),
            }
            for label, ms, flops in (
                ("fwd", row["fwd_ms"], fwd_flops),
                ("fwd_bwd", row["fwd_bwd_ms"], fwd_flops * FWD_BWD_FACTOR),
            ):
                tflops = flops / (ms * 1e-3) / 1e12 if ms else None
                row[f"{label}_tflops"] = tflops
                row[f"{label}_fraction_of_peak"] = tflops / peak if tflops is not None and peak else None
            wanted = TE_CLASS_BY_BACKEND.get(backend) if backend in TE_BACKENDS else None
            if wanted and row["error"] is None and row["te_selected"] != wanted:
                row["error"] = f"TE ran {row['te_selected']} instead of {wanted}"
            rows.append(row)
    return rows


def render(doc: dict[str, Any]) -> str:
    """The results as a text table, with the device, the peak and the FLOP convention."""
    from nemo_rl_attn_align.report.report_render import format_table

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def pct(fraction):
        return num(None if fraction is None else 100 * fraction, ".1f")

    headers = [
        "backend",
        "seq",
        "TE selected",
        "fwd ms",
        "fwd TFLOP/s",
        "fwd %peak",
        "fwd+bwd ms",
        "fwd+bwd TFLOP/s",
        "fwd+bwd %peak",
        "note",
    ]
    table = [
        [
            r["backend"],
            str(r["seq"]),
            r["te_selected"] or "-",
            num(r["fwd_ms"], ".3f"),
            num(r["fwd_tflops"], ".1f"),
            pct(r["fwd_fraction_of_peak"]),
            num(r["fwd_bwd_ms"], ".3f"),
            num(r["fwd_bwd_tflops"], ".1f"),
            pct(r["fwd_bwd_fraction_of_peak"]),
            r["error"] or r["note"],
        ]
        for r in doc["rows"]
    ]
    shape = doc["shape"]
    return "\n".join(
        [
            f"{doc['device']} (sm{''.join(map(str, doc['capability']))}), {doc['peak_source']}",
            f"BF16, causal, batch {shape['batch']}, {shape['heads']} q heads / {shape['kv_heads']} kv heads, "
            f"head dim {shape['head_dim']}; "
            f"median of {shape['iters']} after {shape['warmup']} warm-up; {doc['flop_convention']}",
            format_table(headers, table),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        args.worker_out.write_text(json.dumps(run_worker(args.worker, args)))
        return 0
    problem = missing_requirements(args.backends)
    if problem:
        print(f"attention_backends: cannot run here: {problem}", file=sys.stderr)
        return 2
    from nemo_rl_attn_align.contract.training import library_versions
    from nemo_rl_attn_align.report.store import atomic_write_json

    results = [spawn(backend, argv) for backend in args.backends]
    device = next((r["device"] for r in results if "device" in r), "unknown GPU")
    capability = next((r["capability"] for r in results if "capability" in r), [])
    peak, peak_source = (
        (args.peak_tflops, f"{args.peak_tflops:g} TFLOP/s dense BF16 (--peak-tflops)")
        if args.peak_tflops
        else dense_bf16_peak(device)
    )
    doc = {
        "device": device,
        "capability": capability,
        "peak_bf16_dense_tflops": peak,
        "peak_source": peak_source,
        "shape": {
            "batch": args.batch,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "dtype": "bf16",
            "causal": True,
            "layout": "bshd",
            "warmup": args.warmup,
            "iters": args.iters,
        },
        "flop_convention": "FlashAttention benchmark: fwd 4*b*s^2*h*d/2 (causal), fwd+bwd 3.5x fwd",
        "versions": library_versions(),
        "rows": build_rows(results, args, peak),
    }
    print(render(doc))
    atomic_write_json(args.out, doc)
    print(f"wrote {args.out}")
    return 1 if any(row["error"] for row in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
