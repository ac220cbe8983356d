"""Two captures of the same batch compared: where they first diverge and what attention adds.

Stages, in the order a layer runs them, each with the operator a first difference there points at
(the stage before it agreed): ``qkv`` (the input norm or the QKV projection), ``rope`` (query and
key after RoPE, the projection having agreed), ``attention`` (core attention on inputs that
agreed), ``after_attention`` (the output projection or the residual add), ``after_mlp`` (the pre-MLP
norm or the MLP). Attention's measured share at a layer is the other side's attention run on the
reference side's own query/key/value against the reference side's attention output: what
attention adds by itself, apart from whatever came in. RoPE's measured share, likewise: the other
side's RoPE run on the reference side's QKV output against the reference side's query and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.probe import replay
from nemo_rl_attn_align.probe.capture import Capture
from nemo_rl_attn_align.vocab.errors import UsageError

#: Stage -> (the capture's tensors it compares, the operator a first difference there points at).
STAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "qkv": (("qkv",), "the input norm or QKV projection"),
    "rope": (("query", "key"), "RoPE"),
    "attention": (("attention",), "core attention"),
    "after_attention": (("after_attention",), "the attention output projection or residual add"),
    "after_mlp": (("after_mlp",), "the pre-MLP norm or the MLP"),
}


@dataclass(frozen=True)
class Difference:
    """Max and mean absolute difference of two tensors (float64 on the CPU)."""

    max_abs: float
    mean_abs: float

    def to_dict(self) -> dict[str, float]:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs}


@dataclass(frozen=True)
class LayerDivergence:
    """One layer: each stage's difference, attention's measured share (None: the other side did not
    replay) and the replay estimate beside it (None: a side names no replay)."""

    layer: int
    stages: dict[str, Difference]
    attention_share: Difference | None
    replay_estimate: Difference | None = None
    #: RoPE's measured share (None: the other side did not replay the reference's QKV)
    rope_share: Difference | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "attention_share": _or_none(self.attention_share),
            "replay_estimate": _or_none(self.replay_estimate),
            "rope_share": _or_none(self.rope_share),
        }


def _or_none(diff: Difference | None) -> dict[str, float] | None:
    return None if diff is None else diff.to_dict()


@dataclass(frozen=True)
class FirstDivergence:
    layer: int
    stage: str
    difference: Difference

    @property
    def operator(self) -> str:
        return STAGES[self.stage][1]

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "stage": self.stage, "operator": self.operator, **self.difference.to_dict()}


@dataclass(frozen=True)
class ProbeResult:
    """The comparison of ``other`` (the generation side) against ``reference`` (the training side)."""

    reference: str
    other: str
    atol: float
    layers: tuple[LayerDivergence, ...]
    first: FirstDivergence | None
    logprobs: Difference
    token_mult_prob_error: float
    gen_kl_error: float
    replays: tuple[str, str] | None = None
    #: side name -> what that side replaced to run on this machine (``settings["substitutions"]``).
    substitutions: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "other": self.other,
            "atol": self.atol,
            "first_divergence": None if self.first is None else self.first.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
            "logprobs": self.logprobs.to_dict(),
            "token_mult_prob_error": self.token_mult_prob_error,
            "gen_kl_error": self.gen_kl_error,
            "replays": None if self.replays is None else list(self.replays),
            "substitutions": self.substitutions,
        }


def difference(a: Any, b: Any, where: str) -> Difference:
    """``|a - b|``'s max and mean; differing shapes are a ``UsageError`` naming ``where``."""
    if tuple(a.shape) != tuple(b.shape):
        raise UsageError(f"{where}: shapes {tuple(a.shape)} and {tuple(b.shape)} differ; probe both sides on one batch")
    if a.numel() == 0:
        return Difference(0.0, 0.0)
    diff = (a.double() - b.double()).abs()
    return Difference(float(diff.max()), float(diff.mean()))


def compare(reference: Capture, other: Capture, layers: list[int] | None = None, atol: float = 0.0) -> ProbeResult:
    """Compare ``other`` against ``reference``; a difference above ``atol`` diverges. ``layers`` (default:
    all) chooses the rows reported; the first divergence is always searched from layer 0, since a
    stage's difference is that stage's own only when everything before it agreed."""
    _check_same_batch(reference, other)
    for index in layers or []:
        if not 0 <= index < len(reference.layers):
            raise UsageError(f"--layers: layer {index} does not exist; the model has {len(reference.layers)} layers")
    rows = tuple(_layer(reference, other, index) for index in range(len(reference.layers)))
    return ProbeResult(
        reference=reference.side,
        other=other.side,
        atol=atol,
        layers=rows if layers is None else tuple(rows[i] for i in layers),
        first=_first(rows, atol),
        logprobs=difference(reference.logprobs, other.logprobs, "logprobs"),
        token_mult_prob_error=token_mult_prob_error(other.logprobs, reference.logprobs),
        gen_kl_error=gen_kl_error(other.logprobs, reference.logprobs),
        replays=_replays(reference, other),
        substitutions={c.side: list(c.settings.get("substitutions", [])) for c in (reference, other)},
    )


def _replays(reference: Capture, other: Capture) -> tuple[str, str] | None:
    names = (reference.settings.get("replay"), other.settings.get("replay"))
    return None if None in names else (str(names[0]), str(names[1]))


def _check_same_batch(reference: Capture, other: Capture) -> None:
    if reference.sequences != other.sequences:
        raise UsageError(f"sequences: {reference.side} and {other.side} ran different batches; give both one --prompts")
    if len(reference.layers) != len(other.layers):
        raise UsageError(
            f"layers: {reference.side} has {len(reference.layers)}, {other.side} {len(other.layers)}; "
            "probe two builds of one model"
        )


def _combined(ref: dict[str, Any], oth: dict[str, Any], names: tuple[str, ...], where: str) -> Difference:
    """The largest max and mean difference over the tensors ``names``."""
    parts = [difference(ref[n], oth[n], f"{where} {n}") for n in names]
    return Difference(max(p.max_abs for p in parts), max(p.mean_abs for p in parts))


def _layer(reference: Capture, other: Capture, index: int) -> LayerDivergence:
    ref, oth = reference.layers[index], other.layers[index]
    stages = {stage: _combined(ref, oth, names, f"layer {index}") for stage, (names, _) in STAGES.items()}
    share = None
    if other.replayed_attention:
        share = difference(ref["attention"], other.replayed_attention[index], f"layer {index} replayed attention")
    rope = None
    if other.replayed_rope:
        rope = _combined(ref, other.replayed_rope[index], ("query", "key"), f"layer {index} replayed RoPE")
    replays = replay.estimate(reference, other, index)
    estimate = None if replays is None else difference(*replays, f"layer {index} replays")
    return LayerDivergence(index, stages, share, estimate, rope)


def _first(rows: tuple[LayerDivergence, ...], atol: float) -> FirstDivergence | None:
    for row in rows:
        for stage, diff in row.stages.items():
            if diff.max_abs > atol:
                return FirstDivergence(row.layer, stage, diff)
    return None


# NeMo-RL's train/generation mismatch metrics, computed as its ClippedPGLossFn computes them
# (``nemo_rl/algorithms/loss/loss_functions.py``): every token of the batch counts (mask of ones).
def token_mult_prob_error(generation_logprobs: Any, train_logprobs: Any) -> float:
    """``masked_mean(exp(|gen_lp - train_lp| * mask), mask)``."""
    import torch

    mask = torch.ones_like(train_logprobs)
    lp_error = torch.abs(generation_logprobs - train_logprobs)
    return _masked_mean(torch.exp(lp_error * mask), mask)


def gen_kl_error(generation_logprobs: Any, train_logprobs: Any) -> float:
    """KL(P_gen || P_train), NeMo-RL's default k3 estimate: ``exp(logr) - 1 - logr``, ``logr = train - gen``."""
    import torch

    logr = train_logprobs - generation_logprobs
    return _masked_mean(torch.exp(logr) - 1 - logr, torch.ones_like(logr))


def _masked_mean(values: Any, mask: Any) -> float:
    """NeMo-RL's ``masked_mean`` with no global normalization factor."""
    import torch

    return float(torch.sum(values * mask) / (torch.sum(mask) + 1e-8))
