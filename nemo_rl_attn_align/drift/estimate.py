"""Attention's share of the train/rollout drift: an estimate from replays, labelled as one.

``attention_only_estimate(facts)`` replays the two kernels the recipe's sides run (as ``check --gpu``
predicts them: ``drift.shape.default_engines``) on random inputs at the recipe's attention shape,
through one attention layer and a random LM head, and returns NeMo-RL's ``token_mult_prob_error``
and ``gen_kl_error`` between them, with what the figures assume. It never raises: a failure is
``status: unavailable`` with a one-line ``why``. Torch is imported only where the replays run, so
this module loads on torch-free code paths.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.drift import shape as drift_shape
from nemo_rl_attn_align.drift.shape import EnginePrediction, Shape
from nemo_rl_attn_align.kernels.gpu import parse_gpu
from nemo_rl_attn_align.kernels.kernel_query import DTYPE_OF_PRECISION

if TYPE_CHECKING:
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

ESTIMATED, ZERO, UNAVAILABLE = "estimated", "zero_by_construction", "unavailable"
#: The figures, with the value that means "no drift".
NO_DRIFT = {"token_mult_prob_error": 1.0, "gen_kl_error": 0.0}
DEFAULT_SEEDS = 3
DEFAULT_MAX_SEQ_LEN = 1024
WHY_ESTIMATED = (
    "an estimate from replays of the two engines' reduction orders on random inputs at this shape, not a bound"
)
_WHY_LEN = 400


class Unavailable(Exception):
    """The estimate cannot be made; the message is the one-line why."""


@dataclass(frozen=True)
class Engines:
    """Two named engine specs (``drift.sweep`` materializers) compared at one shape and dtype."""

    shape: Shape
    dtype: str
    training: str
    rollout: str


@dataclass(frozen=True)
class EstimateRequest:
    """How an estimate is made: the GPU its plans are selected for, the seeds, the sequence length
    cap and the LM head's vocabulary."""

    gpu: str = drift_shape.DEFAULT_GPU
    seeds: int = DEFAULT_SEEDS
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    vocab: int = drift_shape.DEFAULT_VOCAB


def result(
    status: str, why: str, known: Mapping[str, Any], figures: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Any]:
    """The estimate's JSON-able dict (the schema the report, the metrics and the driver read); ``known``:
    the ``training`` and ``rollout`` engines, the ``dtype`` and the ``assumes`` lines known (each may be absent)."""
    return {
        "status": status,
        "training_engine": known.get("training"),
        "rollout_engine": known.get("rollout"),
        "dtype": known.get("dtype"),
        "figures": {name: dict(f) for name, f in (figures or {}).items()},
        "assumes": list(known.get("assumes") or []),
        "why": why,
    }


def _one_line(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    if not isinstance(err, (Unavailable, ValueError)) or not text:
        text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= _WHY_LEN else text[: _WHY_LEN - 3] + "..."


def attention_only_estimate(
    facts: RecipeFacts,
    *,
    gpu: str | None = None,
    seeds: int = DEFAULT_SEEDS,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Attention's share of the drift for a recipe on ``gpu`` (default: the driver node's GPU, else
    ``sm90``); never raises (a failure is ``status: unavailable``)."""
    known: dict[str, Any] = {"assumes": []}
    try:
        gpu = parse_gpu(gpu) if gpu is not None else _driver_gpu(known)
        return _estimate(facts, EstimateRequest(gpu, seeds, max_seq_len), environ, known)
    except Exception as err:  # the estimate is observability: it never stops a run
        return result(UNAVAILABLE, _one_line(err), known)


def _driver_gpu(known: dict) -> str:
    """The GPU of the node the driver runs on (NeMo-RL's driver shares a node with workers), else sm90."""
    from nemo_rl_attn_align.kernels.gpu import local_gpu

    gpu, how = local_gpu()
    if gpu is None:
        known["assumes"].append(f"GPU assumed {drift_shape.DEFAULT_GPU}: {how}")
        return drift_shape.DEFAULT_GPU
    known["assumes"].append(f"GPU {gpu}: {how}, on the driver's node")
    return gpu


def _estimate(facts: RecipeFacts, request: EstimateRequest, environ, known: dict) -> dict[str, Any]:
    """The body of ``attention_only_estimate``; ``known`` collects what the unavailable result keeps."""
    gpu = request.gpu
    known["dtype"] = dtype = recipe_dtype(facts)
    _check_sides(facts)
    shape, shape_line = capped_shape(drift_shape.resolve_shape(facts, {}), request.max_seq_len)
    known["assumes"].append(shape_line)
    training, rollout = drift_shape.default_engines(facts, gpu, shape, environ)
    where = f"{dtype} on {gpu}"
    known["training"] = train_spec = _side(training, where)
    known["rollout"] = roll_spec = _side(rollout, where)
    known["assumes"] += [_engine_line(training, train_spec, gpu), _engine_line(rollout, roll_spec, gpu)]
    engines = Engines(shape, dtype, train_spec, roll_spec)
    return estimate_engines(engines, request, assumes=known["assumes"])


def recipe_dtype(facts: RecipeFacts) -> str:
    """The dtype of the replays, from ``policy.precision``; Unavailable when it is not one NeMo-RL takes."""
    policy = facts.require_policy()
    if policy.precision is None:
        raise Unavailable(f"policy.precision={policy.precision_raw!r} is not one of {', '.join(DTYPE_OF_PRECISION)}")
    return DTYPE_OF_PRECISION[policy.precision]


def _check_sides(facts: RecipeFacts) -> None:
    """Unavailable unless Megatron trains and vLLM rolls out, both in ``policy.precision``."""
    if not facts.megatron_enabled:
        raise Unavailable("policy.megatron_cfg is not enabled: only Megatron's training kernel is predicted")
    generation = facts.generation
    if not generation.is_vllm:
        raise Unavailable(f"policy.generation.backend={generation.backend!r}: no vLLM rollout side to compare against")
    precision, rollout = facts.require_policy().precision, generation.precision
    if rollout.value not in (None, precision):
        raise Unavailable(
            f"{rollout.key}={rollout.value!r} differs from policy.precision={precision!r}: "
            "the two sides differ in dtype, which the replays do not separate from attention's order"
        )


def capped_shape(shape: Shape, max_seq_len: int) -> tuple[Shape, str]:
    """``shape`` with its sequence length capped at ``max_seq_len``, and the assumes line saying so."""
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise Unavailable(f"max_seq_len={max_seq_len!r} is not a positive integer")
    where = shape.sources.get("seq_len", "default")
    seq = f"seq len {shape.seq_len} ({where})"
    if shape.seq_len > max_seq_len:
        seq = f"seq len {max_seq_len} (capped from {shape.seq_len}, {where}, to keep the estimate quick)"
        shape = dataclasses.replace(shape, seq_len=max_seq_len, sources=dict(shape.sources))
    window = "no window" if shape.window is None else f"window {shape.window}"
    line = (
        f"shape: {shape.heads} heads, {shape.kv_heads} kv heads, head_dim {shape.head_dim}, {window} "
        f"({shape.sources.get('heads', 'default')}); {seq}"
    )
    return shape, line


def _side(prediction: EnginePrediction, where: str) -> str:
    """The engine a side runs: the first predicted after the reference (vLLM: chunked prefill, no
    cascade); Unavailable when the predicted kernel has no replay (``where``: dtype and GPU)."""
    if prediction.engines:
        return prediction.engines[0]
    if prediction.unreplayed is None:
        raise Unavailable(
            f"Transformer Engine finds no {prediction.side} attention backend for this recipe in {where} "
            "(check --gpu says why): nothing to replay"
        )
    raise Unavailable(
        f"no materializer replays the {prediction.side} kernel {prediction.unreplayed} ({where}): "
        "its reduction order is not modelled"
    )


def _engine_line(prediction: EnginePrediction, spec: str, gpu: str) -> str:
    """Where a side's engine came from: the selector's prediction on ``gpu``, or the assumption and why."""
    side = prediction.side
    path = " (chunked prefill, no cascade attention)" if spec.startswith("vllm") else ""
    if prediction.assumed:
        return f"{side} engine {spec}{path} on {gpu}: assumed ({prediction.assumption})"
    return f"{side} engine {spec}{path}: {prediction.label} on {gpu}, predicted by check --gpu's selectors"


def same_order(training: Any, rollout: Any) -> bool:
    """Whether two materializers run one reduction bit for bit: the same engine and parameters, or
    both the canonical order (the reference, or any engine's ``canonical=1`` twin)."""
    if (training.engine, training.options, training.canonical) == (rollout.engine, rollout.options, rollout.canonical):
        return True
    return all(m.canonical or (m.engine == "reference" and not m.params) for m in (training, rollout))


def estimate_engines(
    engines: Engines, request: EstimateRequest = EstimateRequest(), assumes: list[str] | None = None
) -> dict[str, Any]:
    """The estimate for two named engine specs as ``request`` asks; never raises."""
    assumes = list(assumes or [])
    known: dict[str, Any] = {
        "training": engines.training,
        "rollout": engines.rollout,
        "dtype": engines.dtype,
        "assumes": assumes,
    }
    try:
        return _estimate_engines(engines, request, known)
    except Exception as err:  # the estimate never stops a run
        return result(UNAVAILABLE, _one_line(err), known)


def _estimate_engines(engines: Engines, request: EstimateRequest, known: dict) -> dict[str, Any]:
    """The body of ``estimate_engines``: checks, then the zero case or the replays."""
    try:
        from nemo_rl_attn_align.drift import sweep
    except ImportError as err:
        raise Unavailable(f"the replays need torch, which cannot be imported ({err})") from None
    from nemo_rl_attn_align.reference.materializers import ENGINES

    shape, dtype, seeds, vocab = engines.shape, engines.dtype, request.seeds, request.vocab
    if dtype not in sweep.DTYPES:
        raise Unavailable(f"dtype {dtype!r} is not one of {', '.join(sweep.DTYPES)}")
    for name, value, low in (("seeds", seeds, 1), ("vocab", vocab, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise Unavailable(f"{name}={value!r} must be an integer >= {low}")
    mats = sweep.parse_materializers([engines.training, engines.rollout], "engine")
    sweep.check_materializers(mats, shape, request.gpu)
    for m in mats:
        engine = ENGINES[m.engine]
        if not m.canonical and not engine.replayable:
            raise Unavailable(f"{m.name} is not replayable: {engine.summary}'s reduction order is not public")
        if not sweep.runs_in(m, dtype):
            raise Unavailable(f"{m.name} does not run in {dtype} (it runs in {', '.join(engine.dtypes)} only)")
    if same_order(*mats):
        why = f"both sides run {mats[0].name}, the same reduction bit for bit, so attention adds no drift"
        figures = {name: {"value": v, "low": v, "high": v} for name, v in NO_DRIFT.items()}
        return result(ZERO, why, known, figures)
    known["assumes"] += [
        f"random inputs, {seeds} seeds (q, k, v ~ N(0, 1))",
        f"one attention layer through a random LM head of vocab {vocab}",
    ]
    figures = replay_figures(shape, dtype, mats[0], mats[1], seeds=seeds, vocab=vocab)
    return result(ESTIMATED, WHY_ESTIMATED, known, figures)


def replay_figures(shape: Shape, dtype: str, training: Any, rollout: Any, *, seeds: int, vocab: int) -> dict:
    """Both materializers on seeds ``0..seeds-1``: each figure's mean (value), min (low) and max (high)."""
    import torch

    from nemo_rl_attn_align.drift import sweep

    per_seed: dict[str, list[float]] = {name: [] for name in NO_DRIFT}
    with torch.no_grad():
        for seed in range(seeds):
            q, k, v = (x.to(sweep.DTYPES[dtype]) for x in sweep.make_inputs(shape, seed))
            head = sweep.LMHead(shape.heads * shape.head_dim, vocab, seed)
            gen = rollout(q, k, v, window=shape.window)[0]
            train = training(q, k, v, window=shape.window)[0]
            for name, value in token_figures(head, gen, train).items():
                per_seed[name].append(value)
    figures = {}
    for name, values in per_seed.items():
        if not all(math.isfinite(x) for x in values):
            raise Unavailable(f"{name} is not finite on these inputs ({values})")
        figures[name] = {"value": sum(values) / len(values), "low": min(values), "high": max(values)}
    return figures


def token_figures(head: Any, gen_out: Any, train_out: Any) -> dict[str, float]:
    """NeMo-RL's figures for one sequence through ``head`` (``sweep.LMHead``): tokens sampled from
    the rollout's distribution; ``token_mult_prob_error`` = mean exp(|lp_gen - lp_train|) of them,
    ``gen_kl_error`` = mean over tokens of KL(gen || train) over the whole vocabulary."""
    import torch

    lp_gen = torch.log_softmax(head.logits(gen_out), dim=-1)
    lp_train = torch.log_softmax(head.logits(train_out), dim=-1)
    generator = torch.Generator().manual_seed(head.seed + 2)
    tokens = torch.multinomial(lp_gen.exp(), 1, generator=generator)
    dlp = (lp_gen.gather(-1, tokens) - lp_train.gather(-1, tokens)).abs()
    kl = (lp_gen.exp() * (lp_gen - lp_train)).sum(dim=-1).clamp_min(0.0)
    return {"token_mult_prob_error": float(torch.exp(dlp).mean()), "gen_kl_error": float(kl.mean())}
