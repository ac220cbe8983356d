"""The parts of ``benchmarks/attention_backends.py`` that need no GPU: FLOP convention, peak lookup,
rows and table, command line, and the clear refusal on a machine without CUDA."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from argparse import Namespace

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "attention_backends.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attention_backends_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_follow_flash_attentions_convention(bench):
    # 4 * b * s^2 * h * d, halved for causal: 4 * 1024^2 * 32 * 128 / 2
    assert bench.attention_flops(1, 1024, 32, 128) == 8_589_934_592
    assert bench.attention_flops(1, 1024, 32, 128, causal=False) == 2 * 8_589_934_592
    assert bench.attention_flops(1, 1024, 32, 128, mode="bwd") == 2.5 * 8_589_934_592
    assert bench.attention_flops(2, 8192, 32, 128, mode="fwd_bwd") == 3.5 * 2 * 64 * 8_589_934_592
    with pytest.raises(ValueError, match="fwd, bwd, fwd_bwd"):
        bench.attention_flops(1, 1024, 32, 128, mode="both")


@pytest.mark.parametrize(
    "name, peak, key",
    [
        ("NVIDIA H200", 989.0, "H200"),
        ("NVIDIA H100 80GB HBM3", 989.0, "H100"),
        ("NVIDIA H100 PCIe", 756.0, "H100 PCIe"),
        ("NVIDIA H100 NVL", 835.0, "H100 NVL"),
        ("NVIDIA GH200 480GB", 989.0, "GH200"),
        ("NVIDIA B200", 2250.0, "B200"),
        ("NVIDIA GB200", 2500.0, "GB200"),
        ("NVIDIA A100-SXM4-80GB", 312.0, "A100"),
        ("nvidia a100 80gb pcie", 312.0, "A100"),
    ],
)
def test_dense_bf16_peak_by_device_name(bench, name, peak, key):
    found, source = bench.dense_bf16_peak(name)
    assert found == peak and source.startswith(f"{key}:") and "dense BF16" in source


def test_unknown_gpu_gets_no_fraction(bench):
    found, source = bench.dense_bf16_peak("NVIDIA GeForce RTX 4090")
    assert found is None and "fraction omitted" in source and "--peak-tflops" in source


def test_command_line_defaults_and_refusals(bench, capsys):
    args = bench.parse_args([])
    assert (args.seqs, args.batch, args.heads, args.kv_heads, args.head_dim) == ([1024, 4096, 8192], 1, 32, 8, 128)
    assert args.backends == ["flash", "fused", "unfused", "reference"] and args.worker is None
    for argv, says in (
        (["--heads", "30"], "multiple of --kv-heads"),
        (["--seqs", "1024", "0"], "--seqs must be positive"),
        (["--iters", "0"], "--iters must be at least 1"),
        (["--backends", "sdpa"], "invalid choice"),
        (["--worker", "flash"], "--worker needs --worker-out"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args(argv)
        assert exit_info.value.code == 2 and says in capsys.readouterr().err


def measured(backend, **rows):
    return {"backend": backend, "device": "NVIDIA H200", "capability": [9, 0], "rows": rows}


def test_rows_carry_tflops_fraction_and_what_te_ran(bench):
    args = Namespace(seqs=[1024, 4096], batch=1, heads=32, kv_heads=8, head_dim=128)
    results = [
        measured(
            "flash",
            **{
                "1024": {"fwd_ms": 0.05, "fwd_bwd_ms": 0.25, "te_selected": "FlashAttention", "note": ""},
                "4096": {"error": "OutOfMemoryError: CUDA out of memory"},
            },
        ),
        measured(
            "fused",
            **{"1024": {"fwd_ms": 0.04, "fwd_bwd_ms": 0.2, "te_selected": "UnfusedDotProductAttention", "note": ""}},
        ),
        measured("reference", **{"1024": {"fwd_ms": 5.0, "fwd_bwd_ms": 20.0, "te_selected": None, "note": ""}}),
        {"backend": "unfused", "error": "worker exited 1: ImportError: no TE", "rows": {}},
    ]
    rows = {(r["backend"], r["seq"]): r for r in bench.build_rows(results, args, peak=989.0)}
    flash = rows[("flash", 1024)]
    fwd_flops = bench.attention_flops(1, 1024, 32, 128)
    assert flash["fwd_tflops"] == pytest.approx(fwd_flops / 0.05e-3 / 1e12)
    assert flash["fwd_bwd_tflops"] == pytest.approx(3.5 * fwd_flops / 0.25e-3 / 1e12)
    assert flash["fwd_fraction_of_peak"] == pytest.approx(flash["fwd_tflops"] / 989.0) and flash["error"] is None
    assert rows[("flash", 4096)]["error"].startswith("OutOfMemoryError") and rows[("flash", 4096)]["fwd_tflops"] is None
    assert rows[("fused", 1024)]["error"] == "TE ran UnfusedDotProductAttention instead of FusedAttention"
    assert rows[("fused", 4096)]["error"] == "not measured"
    reference = rows[("reference", 1024)]
    assert reference["error"] is None and reference["te_selected"] is None  # no TE choice to check
    assert reference["fwd_bwd_tflops"] == pytest.approx(3.5 * fwd_flops / 20e-3 / 1e12)
    assert rows[("unfused", 1024)]["error"] == "worker exited 1: ImportError: no TE"
    no_peak = bench.build_rows(results[:1], args, peak=None)[0]
    assert no_peak["fwd_tflops"] == flash["fwd_tflops"] and no_peak["fwd_fraction_of_peak"] is None


def test_table_shows_every_row(bench):
    args = Namespace(seqs=[1024], batch=1, heads=32, kv_heads=8, head_dim=128)
    results = [
        measured(
            "flash", **{"1024": {"fwd_ms": 0.05, "fwd_bwd_ms": 0.25, "te_selected": "FlashAttention", "note": ""}}
        ),
        measured("reference", **{"1024": {"fwd_ms": 5.0, "fwd_bwd_ms": 20.0, "te_selected": None, "note": ""}}),
    ]
    doc = {
        "device": "NVIDIA H200",
        "capability": [9, 0],
        "peak_source": "H200: 989 TFLOP/s dense BF16",
        "shape": {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "warmup": 3, "iters": 10},
        "flop_convention": "FlashAttention benchmark",
        "rows": bench.build_rows(results, args, 989.0),
    }
    lines = bench.render(doc).splitlines()
    assert lines[0] == "NVIDIA H200 (sm90), H200: 989 TFLOP/s dense BF16"
    assert "fwd+bwd TFLOP/s" in lines[2] and set(lines[3]) <= {"-", " "}
    flash_line, reference_line = lines[4], lines[5]
    assert flash_line.split()[:3] == ["flash", "1024", "FlashAttention"] and "17.4" in flash_line  # 17.38 % of 989
    # 8.59 GFLOP in 5 ms, 3.5x that in 20 ms; both 0.2 % of 989
    assert reference_line.split() == ["reference", "1024", "-", "5.000", "1.7", "0.2", "20.000", "1.5", "0.2"]
    json.dumps(doc)  # the same document is what --out writes


def test_reference_step_is_the_references_forward_and_backward(bench):
    """The reference row times ``reference_attention`` on bshd inputs packed as thd, with its backward."""
    torch = pytest.importorskip("torch")
    from nemo_rl_attn_align.reference.attention import reference_attention

    gen = torch.Generator().manual_seed(0)
    batch, seq = 2, 40
    q, k, v = (torch.randn(batch, seq, h, 16, generator=gen).to(torch.bfloat16).requires_grad_() for h in (4, 2, 2))
    grad_out = torch.randn(batch, seq, 4 * 16, generator=gen).to(torch.bfloat16)
    forward, forward_backward = bench.timed_steps(bench.reference_attend(batch, seq), (q, k, v), grad_out)
    out = forward()
    assert out.shape == (batch, seq, 64) and out.requires_grad and q.grad is None
    forward_backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    forward_backward()  # grads are reset, not accumulated
    assert all(torch.equal(x.grad, g) for x, g in zip((q, k, v), grads, strict=True))
    for b in range(batch):  # each batch row is its own causal sequence
        leaves = [x[b].detach().clone().requires_grad_() for x in (q, k, v)]
        alone, _ = reference_attention(*leaves)
        alone.backward(grad_out[b].view(seq, 4, 16))
        assert torch.equal(alone.detach().reshape(seq, 64), out[b].detach())
        assert all(torch.equal(x.grad, g[b]) for x, g in zip(leaves, grads, strict=True))


def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "attention_backends: cannot run here: no CUDA device (torch.cuda.is_available() is False): run it on a GPU node"
    ]
    assert not out.exists()
