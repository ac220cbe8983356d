"""The drift sweep: how far each (training engine, rollout engine) pair lands from each other.

For every dtype and every pair of materializers it runs both on the same random inputs and reports
the max and mean ``|d out|`` (absolute, and in ulps of the dtype at the *local output magnitude*:
the largest ``|out|`` of the same token and head, so near-zero elements do not read as hundreds of
ulps), the share of output elements more than one ulp apart at their own magnitude, ``|d lse|``
(absolute and in FP32 ulps) and the per-token log-probability difference through a small
fixed-seed LM head, summarised like NeMo-RL's ``token_mult_prob_error = mean(exp(|gen_lp -
train_lp|))``. Each engine is also scored against the reference and against the FP64 exact
attention. An engine runs only in the dtypes it accepts (no fp32 rows for FlashAttention, TE's
fused/flash backends or vLLM), and one whose order is not public (TE fused / cuDNN) is listed as
not replayable, with no figures.

The attention shape and the sweep's defaults come from ``shape`` (torch-free, so the CLI can
validate a config without importing torch); ``drift_render`` shows a result (table, heatmap).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from nemo_rl_attn_align.drift.shape import DEFAULT_GPU, DEFAULT_VOCAB, DTYPE_NAMES, Shape
from nemo_rl_attn_align.kernels.kernel_query import PRECISION_OF_DTYPE
from nemo_rl_attn_align.reference.attention import exact_attention, reference_attention
from nemo_rl_attn_align.reference.blocks import ReferenceSpec
from nemo_rl_attn_align.reference.causal import Causal
from nemo_rl_attn_align.reference.materializers import ENGINES, Materializer, parse_materializer
from nemo_rl_attn_align.vocab.errors import UsageError

#: Torch dtype of each name in ``shape.DTYPE_NAMES``.
DTYPES = {name: getattr(torch, PRECISION_OF_DTYPE[name]) for name in DTYPE_NAMES}
#: Standard deviation of the random LM head's logits (RMS-normalised hidden state in).
LOGIT_STD = 3.0


def parse_materializers(specs: list[str], flag: str) -> list[Materializer]:
    """Materializer specs -> objects; UsageError naming the flag and the bad spec."""
    out = []
    for spec in specs:
        try:
            out.append(parse_materializer(spec))
        except ValueError as err:
            raise UsageError(
                f"{flag} {spec!r}: {err}. Fix: e.g. {flag} te-p2p:cp=2 or {flag} vllm:chunk=256,splits=4."
            ) from None
    return out


def check_materializers(mats: list[Materializer], shape: Shape, gpu: str = DEFAULT_GPU) -> None:
    """Stop before any work when an engine cannot run this shape (TE needs length % 2cp == 0) or
    does not run on ``gpu``."""
    for m in mats:
        engine = ENGINES[m.engine]
        if gpu not in engine.gpus:
            other = "vllm" if m.engine == "vllm-fa3" else "vllm-fa3" if m.engine == "vllm" else "another engine"
            raise UsageError(
                f"{m.name}: replays {', '.join(engine.gpus)} only, not --gpu {gpu}. "
                f"Fix: pass --gpu {engine.gpus[0]} or use {other}."
            )
        cp = m.options.get("cp")
        if m.engine.startswith("te-") and cp and shape.seq_len % (2 * cp):
            raise UsageError(
                f"{m.name}: seq_len={shape.seq_len} is not divisible by 2*cp={2 * cp}. "
                f"Fix: pass --seq-len {shape.seq_len - shape.seq_len % (2 * cp) or 2 * cp} or another cp."
            )
        if m.engine.startswith("te-p2p") and shape.window is not None and not m.canonical:
            raise UsageError(
                f"{m.name}: the p2p ring is modelled for full causal attention only, window={shape.window}. "
                "Fix: use te-allgather for sliding-window models."
            )


def ulp_of(x: torch.Tensor, dtype: torch.dtype, work: torch.dtype = torch.float64) -> torch.Tensor:
    """Spacing of ``dtype`` at the values ``x``: ``2**(floor(log2|x|)) * eps``, in ``work`` precision."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(x.abs().clamp_min(info.tiny).to(work))  # |x| = m * 2**e, m in [0.5, 1)
    return torch.exp2(exponent.to(work)) * (info.eps / 2)


#: Magnitudes below this fraction of a tensor's largest are measured in the ulps at that floor,
#: so that two tiny values of opposite sign do not count as thousands of ulps apart.
ULP_FLOOR = 2.0**-8


def ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, floor: float | None = None) -> torch.Tensor:
    """``|a - b|`` in ulps of ``dtype`` at ``max(|a|, |b|, floor)``; floor defaults to
    ``ULP_FLOOR * max|b|`` (FP64 result)."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    floor = ULP_FLOOR * float(b.abs().max()) if floor is None else floor
    return (a - b).abs() / ulp_of(torch.maximum(a.abs(), b.abs()).clamp_min(floor), dtype)


class LMHead:
    """A fixed-seed random LM head: RMS-normalised attention output -> logits -> token logprobs."""

    def __init__(self, hidden: int, vocab: int, seed: int):
        gen = torch.Generator().manual_seed(seed + 1)
        self.weight = torch.randn(hidden, vocab, generator=gen, dtype=torch.float64) * (LOGIT_STD / math.sqrt(hidden))
        self.seed = seed

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        rows = []
        for r0 in range(0, out.shape[0], _ROWS):  # row chunks keep temporaries small
            h = out[r0 : r0 + _ROWS].reshape(-1, self.weight.shape[0]).to(torch.float64)
            rows.append((h / h.pow(2).mean(dim=-1, keepdim=True).sqrt()) @ self.weight)
        return torch.cat(rows)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """Tokens sampled (fixed seed) from the distribution of ``out``, as a rollout would."""
        gen = torch.Generator().manual_seed(self.seed + 2)
        return torch.multinomial(torch.softmax(self.logits(out), dim=-1), 1, generator=gen).squeeze(-1)

    def logprobs(self, out: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(out), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


#: Rows compared at a time: keeps every temporary small (no fresh large allocations per pair).
_ROWS = 256


def _chunked_stats(fields: dict[str, Any], n: int) -> dict[str, float]:
    """Max and mean of each ``fields[name](rows)`` over row chunks of ``_ROWS``."""
    out: dict[str, float] = {}
    for name, fn in fields.items():
        hi, total, count = 0.0, 0.0, 0
        for r0 in range(0, n, _ROWS):
            x = fn(slice(r0, min(n, r0 + _ROWS))).to(torch.float64)
            hi, total, count = max(hi, float(x.max())), total + float(x.sum()), count + x.numel()
        out[f"{name}_max"], out[f"{name}_mean"] = hi, total / max(1, count)
    return out


def local_ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``|a - b|`` (``[T, H, D]``) in ulps of ``dtype`` at the largest ``|a|, |b|`` of the same (token, head)."""
    local = torch.maximum(a.abs().amax(dim=-1, keepdim=True), b.abs().amax(dim=-1, keepdim=True))
    return (a.to(torch.float64) - b.to(torch.float64)).abs() / ulp_of(local, dtype)


def beyond_one_ulp(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1.0 where ``a`` and ``b`` are more than one ulp (of ``dtype``, at their own magnitude) apart.

    Two bf16/fp16 tensors are compared in FP32 (exact for their values, and its rounding of the
    difference is far below their ulp); anything else in FP64."""
    half = (torch.bfloat16, torch.float16)
    work = torch.float32 if a.dtype in half and b.dtype in half else torch.float64
    a, b = a.to(work), b.to(work)
    return ((a - b).abs() > ulp_of(torch.maximum(a.abs(), b.abs()), dtype, work)).to(torch.float32)


def compare(a: tuple, b: tuple, lp_a: torch.Tensor, lp_b: torch.Tensor) -> dict[str, float]:
    """Drift figures between two ``(out, lse)`` results and their token logprobs."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    dlp = (lp_a - lp_b).abs()
    lse_floor = ULP_FLOOR * float(lse_b.abs().max())
    stats = _chunked_stats(
        {
            "out_abs": lambda r: (out_a[r].double() - out_b[r].double()).abs(),
            "out_ulp": lambda r: local_ulps(out_a[r], out_b[r], out_a.dtype),
            "out_beyond_1ulp": lambda r: beyond_one_ulp(out_a[r], out_b[r], out_a.dtype),
            "lse_abs": lambda r: (lse_a[r].double() - lse_b[r].double()).abs(),
            "lse_ulp": lambda r: ulps(lse_a[r], lse_b[r], torch.float32, lse_floor),
        },
        out_a.shape[0],
    )
    stats.pop("out_beyond_1ulp_max")
    stats["out_beyond_1ulp"] = stats.pop("out_beyond_1ulp_mean")
    return {
        **stats,
        "logprob_abs_max": float(dlp.max()),
        "logprob_abs_mean": float(dlp.mean()),
        "token_mult_prob_error": float(torch.exp(dlp).mean()),
        "bitwise_equal": bool(torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)),
    }


def _vs_exact(result: tuple, exact: tuple, dtype: torch.dtype) -> dict[str, float]:
    """Largest errors of ``(out, lse)`` against the FP64 exact attention, and the share of output
    elements more than one ulp from it."""
    stats = _chunked_stats(
        {
            "out_abs": lambda r: (result[0][r].double() - exact[0][r]).abs(),
            "out_ulp": lambda r: local_ulps(result[0][r], exact[0][r], dtype),
            "lse_abs": lambda r: (result[1][r].double() - exact[1][r]).abs(),
            "out_beyond_1ulp": lambda r: beyond_one_ulp(result[0][r], exact[0][r], dtype),
        },
        result[0].shape[0],
    )
    share = stats["out_beyond_1ulp_mean"]
    return {**{k: v for k, v in stats.items() if k.endswith("_max") and "beyond" not in k}, "out_beyond_1ulp": share}


class Progress:
    """A stdlib progress bar on stderr (a redrawn line on a terminal, one line per step elsewhere)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = total, 0, enabled
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = int(30 * self.done / max(1, self.total))
        line = f"[{'#' * filled}{'-' * (30 - filled)}] {self.done}/{self.total} {label}"
        if self.tty:
            self.stream.write("\r" + line.ljust(90) + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def make_inputs(shape: Shape, seed: int):
    """FP32 ``q, k, v`` ~ N(0, 1) for one sequence; each dtype rounds the same values."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.seq_len, shape.heads, shape.head_dim, generator=gen)
    k = torch.randn(shape.seq_len, shape.kv_heads, shape.head_dim, generator=gen)
    v = torch.randn(shape.seq_len, shape.kv_heads, shape.head_dim, generator=gen)
    return q, k, v


def runs_in(m: Materializer, dname: str) -> bool:
    """Whether the engine of ``m`` is replayable and accepts dtype ``dname`` (canonical twins: any)."""
    engine = ENGINES[m.engine]
    return m.canonical or (engine.replayable and dname in engine.dtypes)


@dataclass(frozen=True)
class Sweep:
    """One drift sweep: the attention ``shape``, the dtypes, the training and rollout engines, the
    GPU whose paths they replay, the inputs' and LM head's ``seed``, its ``vocab``, the reference's tiles."""

    shape: Shape
    dtypes: list[str]
    training: list[Materializer]
    rollout: list[Materializer]
    gpu: str = DEFAULT_GPU
    seed: int = 0
    vocab: int = DEFAULT_VOCAB
    spec: ReferenceSpec = ReferenceSpec()

    @property
    def engines(self) -> list[Materializer]:
        """Every engine once, training first."""
        return list(dict.fromkeys([*self.training, *self.rollout]))

    def describe(self) -> dict[str, Any]:
        """What the sweep runs (the report's head): shape, dtypes, engines and what each replays, skips, inputs."""
        engines = self.engines
        return {
            "shape": self.shape.to_dict(),
            "dtypes": list(self.dtypes),
            "training": [m.name for m in self.training],
            "rollout": [m.name for m in self.rollout],
            "gpu": self.gpu,
            "replays": {m.name: ENGINES[m.engine].replays for m in engines},
            "not_replayable": [m.name for m in engines if not m.canonical and not ENGINES[m.engine].replayable],
            "skipped": [
                {"engine": m.name, "dtype": d}
                for d in self.dtypes
                for m in engines
                if ENGINES[m.engine].replayable and not runs_in(m, d)
            ],
            "seed": self.seed,
            "vocab": self.vocab,
            "reference_spec": {"block_q": self.spec.block_q, "block_kv": self.spec.block_kv},
        }


def run_sweep(sweep: Sweep, progress: Progress | None = None) -> dict[str, Any]:
    """Run every engine once per dtype it accepts and compare all (training, rollout) pairs that both ran."""
    shape, spec, engines = sweep.shape, sweep.spec, sweep.engines
    progress = progress or Progress(0, enabled=False)
    progress.total = len(sweep.dtypes) * 2 + sum(runs_in(m, d) for m in engines for d in sweep.dtypes)
    head = LMHead(shape.heads * shape.head_dim, sweep.vocab, sweep.seed)
    q32, k32, v32 = make_inputs(shape, sweep.seed)
    pairs, plans, started = [], [], time.perf_counter()
    for dname in sweep.dtypes:
        q, k, v = (x.to(DTYPES[dname]) for x in (q32, k32, v32))
        exact = exact_attention(q, k, v, Causal(shape.window))
        progress.step(f"{dname} fp64 exact")
        ref = reference_attention(q, k, v, Causal(shape.window), spec=spec)
        tokens = head.sample(ref[0])
        ref_lp = head.logprobs(ref[0], tokens)
        progress.step(f"{dname} reference")
        results, logprobs = {}, {}
        for m in engines:
            if not runs_in(m, dname):
                continue
            t0 = time.perf_counter()
            results[m] = ref if m.engine == "reference" and not m.params else m(q, k, v, window=shape.window, spec=spec)
            logprobs[m] = head.logprobs(results[m][0], tokens)
            seconds = time.perf_counter() - t0
            plans.append(
                {
                    "dtype": dname,
                    "engine": m.name,
                    "replays": ENGINES[m.engine].replays,
                    "seconds": seconds,
                    "vs_reference": compare(results[m], ref, logprobs[m], ref_lp),
                    "vs_fp64": _vs_exact(results[m], exact, q.dtype),
                }
            )
            progress.step(f"{dname} {m.name}")
        pairs += _compare_pairs(dname, sweep.training, sweep.rollout, results, logprobs)
    return {
        **sweep.describe(),
        "pairs": pairs,
        "engines": plans,
        "elapsed_s": time.perf_counter() - started,
    }


def _compare_pairs(
    dname: str, training: list[Materializer], rollout: list[Materializer], results: dict, logprobs: dict
) -> list[dict[str, Any]]:
    """The figures of every (training, rollout) pair that both ran in ``dname``."""
    return [
        {
            "dtype": dname,
            "training": t.name,
            "rollout": r.name,
            **compare(results[t], results[r], logprobs[t], logprobs[r]),
        }
        for t in training
        for r in rollout
        if t in results and r in results
    ]
