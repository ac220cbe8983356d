"""The device checks (``tests/gpu/run_device_checks.sh OUT``): what can be measured on a bare GPU.

Sized for one 10-minute call on one H200 with Python 3.12, torch with CUDA and Triton only (no
Transformer Engine, flash-attn or vLLM; a megatron-core wheel may travel). Five sections, each
written to ``OUT/device-checks.json`` as it finishes (a timeout keeps what is done):

* ``reference_invariance`` -- the reference on CUDA under every plan axis (CP size, layout and
  comm, KV splits, chunked prefill and page size, packed batches): ``torch.equal`` to one pass.
* ``fa2_vs_sdpa`` -- the FA2 replays (``flash`` tile by head dim, ``flash:splits=0`` with FA2's
  heuristic) and the reference, run on CUDA, against torch's own SDPA kernels on the same inputs:
  ``SDPBackend.FLASH_ATTENTION`` (torch's vendored FlashAttention-2) and
  ``SDPBackend.CUDNN_ATTENTION`` (cuDNN fused attention, which TE's fused backend also calls);
  per (replay, kernel, dtype, shape) the fraction of bitwise-equal output elements and the max
  ulp at the local output magnitude.
* ``megatron_local`` -- megatron-core's local ``DotProductAttention`` on CUDA against its replay
  (``torch.equal``, forward and backward), when megatron-core imports.
* ``probe`` -- ``probe``'s megatron-core sides (``probe/megatron_side.py``, a tiny GPTModel, each
  side in its own process as the CLI runs them) on the device, bf16: an aligned pair (no first
  divergence, attention adds 0 at every layer) and one attention knob (``softmax_scale``: named at
  core attention, layer 0, the replay estimate beside the measured share), with the figures.
* ``fingerprints`` -- both sides' behaviour fingerprints (``rope``, ``mask``, ``softmax``, read from
  the live modules by ``hosts.megatron_behaviour`` as the Megatron worker's hook reads them) of
  ``probe``'s tiny megatron-core model on the device, bf16: the two sides of one model bound by
  ``binding.behaviour_difference`` (no difference), a sliding window on one side named at layer 0, and each
  fingerprint the same read again with the model moved to the CPU (megatron-core's ``get_emb`` may
  still evaluate on the current CUDA device). Both sides are megatron-core's: the device
  has no vLLM (bug 6 of docs/upstream-bugs.md: the kernels differ per GPU, the fingerprints must not).

The pure parts (cases, comparison, the JSON record) run on CPU in ``test_device_checks.py``.
Usage: ``python -m tests.gpu.device_checks OUT [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

#: (label, seq, heads, kv_heads, head_dim) for the kernel comparison; GQA as in Qwen3/Llama.
KERNEL_SHAPES = [
    ("s512-h8-kv8-d64", 512, 8, 8, 64),
    ("s2048-h32-kv8-d128", 2048, 32, 8, 128),
    ("s1024-h16-kv8-d128", 1024, 16, 8, 128),
]
QUICK_SHAPES = [("s128-h4-kv2-d64", 128, 4, 2, 64)]
REPLAYS = ("reference", "flash", "flash:splits=0")
KERNELS = ("FLASH_ATTENTION", "CUDNN_ATTENTION")
DTYPE_NAMES = ("bf16", "fp16")


def agreement(a, b, dtype) -> dict:
    """``{"equal_fraction", "max_ulp"}`` of two ``[T, H, D]`` outputs (ulps at the local magnitude)."""

    from nemo_rl_attn_align.drift.sweep import local_ulps

    a, b = a.detach().cpu(), b.detach().cpu()
    return {"equal_fraction": float((a == b).double().mean()), "max_ulp": float(local_ulps(a, b, dtype).max())}


class Record:
    """The JSON record under OUT, rewritten after every section so a timeout keeps what is done."""

    def __init__(self, out: Path):
        self.path = Path(out) / "device-checks.json"
        self.data: dict = {"sections": {}, "errors": {}}

    def section(self, name: str, value) -> None:
        self.data["sections"][name] = value
        self._write()

    def error(self, name: str, err: BaseException) -> None:
        self.data["errors"][name] = "".join(traceback.format_exception_only(type(err), err)).strip()
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def _qkv(seq, heads, kv_heads, dim, dtype, device, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(seq, h, dim, generator=gen).to(dtype).to(device) for h in (heads, kv_heads, kv_heads))


def reference_invariance(device: str, quick: bool) -> list[dict]:
    """The reference's bits under every plan axis on ``device``: one row per (dtype, window, plan)."""
    import torch

    from nemo_rl_attn_align.reference.attention import reference_attention
    from nemo_rl_attn_align.reference.blocks import ReferenceSpec
    from nemo_rl_attn_align.reference.causal import Causal
    from nemo_rl_attn_align.reference.plans import CP_COMMS, LAYOUTS, ChunkedPrefill, ContextParallel, SplitKV

    spec = ReferenceSpec(block_q=16, block_kv=32) if quick else ReferenceSpec()
    seq, heads, kv_heads, dim = (101, 4, 2, 16) if quick else (1000, 8, 2, 64)
    plans = [ContextParallel(size, layout, comm) for size in (2, 4, 8) for layout in LAYOUTS for comm in CP_COMMS]
    plans += [
        SplitKV(num_splits=3),
        SplitKV(split_size=200),
        ChunkedPrefill(64, 16),
        ChunkedPrefill(7, 1, num_splits=3),
    ]
    rows = []
    for dname, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        q, k, v = _qkv(seq, heads, kv_heads, dim, dtype, device)
        for window in (None, 127):
            base = reference_attention(q, k, v, Causal(window), spec=spec)
            for plan in plans:
                got = reference_attention(q, k, v, Causal(window), plan=plan, spec=spec)
                rows.append(
                    {
                        "dtype": dname,
                        "window": window,
                        "plan": repr(plan),
                        "equal": bool(torch.equal(got[0], base[0]) and torch.equal(got[1], base[1])),
                        "max_abs_diff": _max_abs_diff(got, base),
                    }
                )
            cu = torch.tensor([0, seq // 3, seq], device=device)
            packed = reference_attention(q, k, v, Causal(window, cu_seqlens_q=cu, cu_seqlens_k=cu), spec=spec)
            alone = reference_attention(q[seq // 3 :], k[seq // 3 :], v[seq // 3 :], Causal(window), spec=spec)
            rows.append(
                {
                    "dtype": dname,
                    "window": window,
                    "plan": "packed batch (second sequence)",
                    "equal": bool(torch.equal(packed[0][seq // 3 :], alone[0])),
                    "max_abs_diff": _max_abs_diff((packed[0][seq // 3 :],), (alone[0],)),
                }
            )
    return rows


def _max_abs_diff(got, base) -> float:
    """Largest |got - base| over the paired outputs (0.0 when bitwise equal), for the record."""
    return max(float((g.double() - b.double()).abs().max()) for g, b in zip(got, base, strict=True))


def sdpa_kernel(q, k, v, backend: str):
    """Causal SDPA with one backend on ``[S, H, D]`` inputs (KV heads repeated): ``[S, Hq, D]``."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel as use

    g = q.shape[1] // k.shape[1]
    qs, ks, vs = (x.transpose(0, 1)[None] for x in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)))
    with use([getattr(SDPBackend, backend)]):
        return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1)


def fa2_vs_sdpa(device: str, quick: bool) -> list[dict]:
    """Replays vs SDPA kernels: one row per (replay, kernel, dtype, shape)."""
    import torch

    from nemo_rl_attn_align.reference.materializers import parse_materializer

    rows = []
    for label, seq, heads, kv_heads, dim in QUICK_SHAPES if quick else KERNEL_SHAPES:
        for dname, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            q, k, v = _qkv(seq, heads, kv_heads, dim, dtype, device)
            kernels = {}
            for kernel in KERNELS:
                try:
                    kernels[kernel] = sdpa_kernel(q, k, v, kernel)
                except RuntimeError as err:  # a backend this build or GPU lacks
                    kernels[kernel] = str(err).splitlines()[0]
            for replay in REPLAYS:
                out, _ = parse_materializer(replay)(q, k, v)
                for kernel, result in kernels.items():
                    row = {"replay": replay, "kernel": kernel, "dtype": dname, "shape": label}
                    row.update(agreement(out, result, dtype) if not isinstance(result, str) else {"error": result})
                    rows.append(row)
    return rows


def megatron_local(device: str) -> list[dict]:
    """megatron-core's local DotProductAttention on ``device`` vs its replay, fwd and bwd."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from nemo_rl_attn_align.reference.blocks import Geometry
    from nemo_rl_attn_align.reference.unfused import megatron_local_attention

    if not torch.distributed.is_initialized():
        import os

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(0)
    rows = []
    heads, kv_heads, dim, seq = 8, 2, 64, 256
    for dname, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for window in (None, 63):
            config = TransformerConfig(
                num_layers=1,
                hidden_size=heads * dim,
                num_attention_heads=heads,
                num_query_groups=kv_heads,
                kv_channels=dim,
                attention_dropout=0.0,
                bf16=dname == "bf16",
                fp16=dname == "fp16",
                params_dtype=dtype,
                masked_softmax_fusion=False,
                attention_softmax_in_fp32=True,
                window_size=None if window is None else (window, 0),
            )
            module = DotProductAttention(
                config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
            )
            q, k, v = _qkv(seq, heads, kv_heads, dim, dtype, device)
            dout = torch.randn(q.shape, device=device).to(dtype)
            real = [x.clone().requires_grad_() for x in (q, k, v)]
            ours = [x.clone().requires_grad_() for x in (q, k, v)]
            causal = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool, device=device), diagonal=1)
            out_real = module(real[0][:, None], real[1][:, None], real[2][:, None], attention_mask=causal).view(
                seq, heads, dim
            )
            out_ours, _ = megatron_local_attention(*ours, Geometry.of(q, k, window, None, seq, seq))
            out_real.backward(dout)
            out_ours.backward(dout)
            rows.append(
                {
                    "dtype": dname,
                    "window": window,
                    "forward_equal": bool(torch.equal(out_real, out_ours)),
                    "backward_equal": all(bool(torch.equal(a.grad, b.grad)) for a, b in zip(real, ours, strict=True)),
                }
            )
    return rows


def probe(device: str) -> list[dict]:
    """``probe``'s megatron-core sides on ``device`` (bf16), through the driver as the CLI runs them."""
    import tempfile

    from nemo_rl_attn_align.probe import driver, render
    from nemo_rl_attn_align.probe.sides import DEFAULT_SEQUENCES, SideSpec

    model = {"bf16": True, "params_dtype": "bfloat16"} if device == "cuda" else {}
    rows = []
    for name, knob in (("aligned", {}), ("softmax_scale", {"softmax_scale": 0.1})):
        with tempfile.TemporaryDirectory() as scratch:
            request = driver.ProbeRequest(
                SideSpec("train", model=model),
                SideSpec(name, model={**model, **knob}),
                DEFAULT_SEQUENCES,
                Path(scratch),
            )
            start = time.perf_counter()
            result = driver.run(request)
        shares = [row.attention_share.max_abs if row.attention_share else None for row in result.layers]
        estimates = [row.replay_estimate.max_abs if row.replay_estimate else None for row in result.layers]
        first = (result.first.layer, result.first.stage) if result.first else None
        expected = None if name == "aligned" else (0, "attention")
        rows.append(
            {
                "case": name,
                "seconds": round(time.perf_counter() - start, 2),
                "verdict": render.verdict(result),
                "first": first,
                "attention_share": shares,
                "replay_estimate": estimates,
                "token_mult_prob_error": result.token_mult_prob_error,
                "equal": first == expected and (name != "aligned" or not any(shares)),
            }
        )
    return rows


def fingerprints(device: str) -> list[dict]:
    """Both sides' behaviour fingerprints of one model on ``device`` (bf16 there), per case: each side's
    fields, what ``binding.behaviour_difference`` finds between the sides, and whether each side reads the same
    with its model moved to the CPU (``equal``: the expected difference only, every field observed,
    the same off the device)."""
    from nemo_rl_attn_align.binding.behaviour_difference import difference
    from nemo_rl_attn_align.hosts import megatron_behaviour
    from nemo_rl_attn_align.probe.megatron_side import build
    from nemo_rl_attn_align.probe.sides import SideSpec
    from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS

    model = {"bf16": True, "params_dtype": "bfloat16"} if device == "cuda" else {}
    rows = []
    for name, knob, expected in (("aligned", {}, None), ("window", {"window_size": (7, 0)}, ("mask", 0))):
        start = time.perf_counter()
        sides, off_device = {}, {}
        for side, spec in (
            ("training", SideSpec("train", model=model)),
            ("rollout", SideSpec(name, model={**model, **knob})),
        ):
            built = build(spec)
            fields, _ = megatron_behaviour.read(built)
            sides[side] = {
                f: {"provenance": v.provenance.value, "value": v.value, "source": v.source} for f, v in fields.items()
            }
            cpu_fields, _ = megatron_behaviour.read(built.to("cpu"))
            off_device[side] = all(
                v.value is None or difference(f, v.value, cpu_fields[f].value) is None for f, v in fields.items()
            )
        found = {}
        for field in BEHAVIOUR_FIELDS:
            t, r = sides["training"][field]["value"], sides["rollout"][field]["value"]
            diff = difference(field, t, r) if t is not None and r is not None else None
            found[field] = (
                None if diff is None else {"layer": diff.layer, "position": diff.position, "message": diff.message}
            )
        named = [(f, d["layer"]) for f, d in found.items() if d is not None]
        observed = all(v["provenance"] == "observed" for s in sides.values() for v in s.values())
        rows.append(
            {
                "case": name,
                "seconds": round(time.perf_counter() - start, 2),
                "sides": sides,
                "differences": found,
                "same_on_cpu": off_device,
                "equal": observed and named == ([expected] if expected else []) and all(off_device.values()),
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="small shapes (a CPU smoke run)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    record = Record(args.out)
    record.data["environment"] = {
        "torch": torch.__version__,
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "capability": list(torch.cuda.get_device_capability()) if device == "cuda" else None,
    }
    sections = [
        ("reference_invariance", lambda: reference_invariance(device, args.quick)),
        ("fa2_vs_sdpa", lambda: fa2_vs_sdpa(device, args.quick)),
        ("megatron_local", lambda: megatron_local(device)),
        ("probe", lambda: probe(device)),
        ("fingerprints", lambda: fingerprints(device)),
    ]
    failed = False
    for name, run in sections:
        start = time.perf_counter()
        try:
            rows = run()
        except ImportError as err:  # megatron-core did not travel
            record.error(name, err)
            continue
        except Exception as err:
            record.error(name, err)
            failed = True
            continue
        record.section(name, {"seconds": round(time.perf_counter() - start, 2), "rows": rows})
        failed |= any(
            row.get("equal") is False or row.get("forward_equal") is False or row.get("backward_equal") is False
            for row in rows
        )
    print(json.dumps({"out": str(record.path), "errors": record.data["errors"], "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
