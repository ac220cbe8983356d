"""Materializers: the reference's arithmetic replayed in the order each real engine uses.

Each takes one sequence (``q`` ``[S, Hq, D]``, ``k``/``v`` ``[S, Hkv, D]``, causal, optional left
window) and returns ``(out, lse)`` like ``reference_attention``. With ``canonical=True`` a
materializer keeps its decomposition (ranks, chunks, splits, pages) but computes and merges in the
canonical order, i.e. it runs the reference under the matching plan; the tests show it then equals
the reference bit for bit, so any drift figure is attributable to the engine's order alone.

Every engine in ``ENGINES`` names what it replays (engine, versions, source file and function),
the GPU generations on which that engine runs that path, and the dtypes it accepts (``Engine``);
the replays themselves are in ``replays``, the FlashAttention facts in ``kernels``. In short:

* ``te-p2p`` / ``te-p2p-bshd`` -- Transformer Engine 2.14-2.15 CP p2p ring
  (``AttnFuncWithCPAndKVP2P.forward`` in ``transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py``) with FlashAttention-2 per step (TE's flash
  backend): load-balanced chunks (rank r holds chunks r and 2cp-1-r); at step i rank r attends to
  the KV of rank (r - i) % cp -- step 0 causal on both local chunks, steps i <= r all local
  queries against the first KV chunk, steps i > r the second query chunk against both KV chunks.
  Each step returns ``out`` in the input dtype and an FP32 LSE; the LSEs are merged in step order
  by ``max + log1p(exp(min - max))``. The outputs are then corrected in step order, differently
  per format. ``thd`` (packed; NeMo-RL's case, since it requires sequence packing with CP > 1):
  ``out`` starts at zero and ``thd_out_correction_kernel`` (``transformer_engine/common/
  fused_attn/context_parallel.cu``) adds ``(dtype)(float(o_i) * exp(lse_i - lse))`` to it in the
  input dtype -- two roundings per step. ``bshd``/``sbhd``: ``flash_attn_fwd_out_correction_init``
  rounds step 0's product, then ``flash_attn_fwd_out_correction`` adds each FP32 product in place
  -- one rounding per step.
* ``te-allgather`` -- TE's ``AttnFuncWithCPAndKVAllGather``: KV gathered, one FA2 call per local
  chunk over KV ``[max(0, c*L - W), (c+1)*L)`` (``get_kv_seq_info_after_all_gather``).
* ``flash`` -- one flash-attention 2.8 forward (``flash_api.cpp``): ``splits=1`` is
  ``mha_varlen_fwd`` (packed thd: never splits a prefill), ``splits=0`` dense ``mha_fwd`` with its
  own ``num_splits_heuristic`` for the GPU's SM count, ``splits=N`` the split-KV kernel with N splits.
* ``vllm`` -- vLLM (0.11 and later, ``vllm/v1/attention/backends/flash_attn.py``) with FA2 on sm80:
  the prompt in chunks of ``chunk`` tokens over a paged KV cache (``page`` tokens a page; the
  paged call is the split-KV kernel), KV splits only for decode (one-token chunks; ``splits=0``:
  FA2's heuristic), and with ``cascade=P`` cascade attention for queries past a shared prefix of
  P tokens: one non-causal call over the prefix, one causal over the rest, merged by
  ``merge_attn_states``.
* ``vllm-fa3`` -- the same scheduler with FA3 on sm90 (``vllm_flash_attn`` FA3): FA3 tiles,
  splits over each row block's visible tile range, on prefill chunks and decode alike
  (``splits=0``: FA3's heuristic).
* ``megatron-local`` / ``hf-eager`` -- the unfused attentions of ``unfused`` (proven equal to the
  real modules on CPU).
* ``te-fused`` -- TE's FusedAttention (cuDNN), what TE prefers on sm90: cuDNN's reduction order is
  not public, so it is *not replayable*; the sweep reports it without figures rather than
  substituting another engine's order.
* ``reference`` -- the reference itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nemo_rl_attn_align.reference.attention import fp32_matmuls, reference_attention
from nemo_rl_attn_align.reference.blocks import Geometry, ReferenceSpec
from nemo_rl_attn_align.reference.causal import Causal
from nemo_rl_attn_align.reference.plans import ChunkedPrefill, ContextParallel, SinglePass, SplitKV
from nemo_rl_attn_align.reference.replays import flash, te_allgather, te_p2p, vllm
from nemo_rl_attn_align.reference.unfused import hf_eager_attention, megatron_local_attention

#: GPU generations the sweep can select plans for (``--gpu``).
GPUS = ("sm80", "sm90")
HALF = ("bf16", "fp16")
ALL_DTYPES = ("bf16", "fp16", "fp32")


class NotReplayable(RuntimeError):
    """The engine's reduction order is not public: no replay exists."""


def _not_replayable(q, k, v, geom, p):
    raise NotReplayable("TE FusedAttention runs cuDNN's fused kernels, whose reduction order is not public")


@dataclass(frozen=True)
class Engine:
    """One engine's replay: its parameters with defaults, the plan its canonical twin uses, what it
    replays (engine, versions, source), the GPU generations it runs that path on, its dtypes."""

    run: Callable | None
    params: dict
    plan: Callable
    summary: str
    replays: str
    gpus: tuple = GPUS
    dtypes: tuple = HALF
    differentiable: bool = False

    @property
    def replayable(self) -> bool:
        return self.run is not _not_replayable


def _cp_plan(comm):
    return lambda p: ContextParallel(p["cp"], "load_balanced", comm)


def _vllm_plan(p):
    return ChunkedPrefill(p["chunk"], p["page"], num_splits=p["splits"] or None)


_VLLM_PARAMS = {"chunk": 256, "page": 16, "splits": 0, "cascade": 0, "tile": 0}
_FA2 = "flash-attention 2.8 (flash_api.cpp mha_varlen_fwd / mha_fwd)"

ENGINES: dict[str, Engine] = {
    "reference": Engine(
        None,
        {},
        lambda p: SinglePass(),
        "the canonical reference",
        "the canonical reference (any device)",
        dtypes=ALL_DTYPES,
    ),
    "flash": Engine(
        flash,
        {"splits": 1, "tile": 0, "gpu": 90},
        lambda p: SplitKV(num_splits=p["splits"]) if p["splits"] > 1 else SinglePass(),
        "one FlashAttention-2 forward call",
        _FA2,
    ),
    "te-p2p": Engine(
        lambda q, k, v, g, p: te_p2p(q, k, v, g, p, True),
        {"cp": 2, "tile": 0},
        _cp_plan("p2p"),
        "Transformer Engine CP p2p ring, packed thd",
        "Transformer Engine 2.14-2.15 AttnFuncWithCPAndKVP2P, qkv_format thd (thd_out_correction_kernel), "
        "FlashAttention-2 per step",
    ),
    "te-p2p-bshd": Engine(
        lambda q, k, v, g, p: te_p2p(q, k, v, g, p, False),
        {"cp": 2, "tile": 0},
        _cp_plan("p2p"),
        "Transformer Engine CP p2p ring, bshd/sbhd",
        "Transformer Engine 2.14-2.15 AttnFuncWithCPAndKVP2P, qkv_format bshd/sbhd "
        "(flash_attn_fwd_out_correction), FlashAttention-2 per step",
    ),
    "te-allgather": Engine(
        te_allgather,
        {"cp": 2, "tile": 0},
        _cp_plan("all_gather"),
        "Transformer Engine CP KV all-gather",
        "Transformer Engine 2.14-2.15 AttnFuncWithCPAndKVAllGather, FlashAttention-2 per chunk",
    ),
    "te-fused": Engine(
        _not_replayable,
        {},
        lambda p: SinglePass(),
        "Transformer Engine FusedAttention (cuDNN)",
        "Transformer Engine 2.14-2.15 FusedAttention (cuDNN fused attention): not replayable",
    ),
    "vllm": Engine(
        lambda q, k, v, g, p: vllm(q, k, v, g, p, fa3=False),
        dict(_VLLM_PARAMS),
        _vllm_plan,
        "vLLM chunked prefill over paged KV, FlashAttention-2",
        "vLLM >= 0.11 FlashAttentionImpl (v1/attention/backends/flash_attn.py) with FA2: paged split-KV "
        "kernel, decode-only splits, cascade via merge_attn_states",
        gpus=("sm80",),
    ),
    "vllm-fa3": Engine(
        lambda q, k, v, g, p: vllm(q, k, v, g, p, fa3=True),
        dict(_VLLM_PARAMS),
        _vllm_plan,
        "vLLM chunked prefill over paged KV, FlashAttention-3",
        "vLLM >= 0.11 FlashAttentionImpl with vllm_flash_attn FA3 (hopper/): FA3 tiles, splits over the "
        "visible tile range, cascade via merge_attn_states",
        gpus=("sm90",),
    ),
    "megatron-local": Engine(
        lambda q, k, v, g, p: megatron_local_attention(q, k, v, g),
        {},
        lambda p: SinglePass(),
        "Megatron's own DotProductAttention (local spec)",
        "megatron-core 0.14-0.16 DotProductAttention.forward + FusedScaleMaskSoftmax.forward_torch_softmax",
        dtypes=ALL_DTYPES,
        differentiable=True,
    ),
    "hf-eager": Engine(
        lambda q, k, v, g, p: hf_eager_attention(q, k, v, g),
        {},
        lambda p: SinglePass(),
        "Hugging Face eager attention",
        "transformers 5.5-5.8 eager_attention_forward (models/llama/modeling_llama.py)",
        dtypes=ALL_DTYPES,
        differentiable=True,
    ),
}


@dataclass(frozen=True)
class Materializer:
    """An engine with its parameters, e.g. ``te-p2p:cp=4``; call it like ``reference_attention``."""

    engine: str
    params: tuple = ()
    canonical: bool = False

    @property
    def options(self) -> dict:
        merged = dict(ENGINES[self.engine].params)
        merged.update(self.params)
        return merged

    @property
    def name(self) -> str:
        shown = [f"{k}={v}" for k, v in self.params]
        if self.canonical:
            shown.append("canonical=1")
        return self.engine + (":" + ",".join(shown) if shown else "")

    def __call__(
        self, q, k, v, *, window: int | None = None, scale: float | None = None, spec: ReferenceSpec = ReferenceSpec()
    ):
        geom = Geometry.of(q, k, window, scale, q.shape[0], k.shape[0])
        engine = ENGINES[self.engine]
        if self.canonical or engine.run is None:
            return reference_attention(q, k, v, Causal(window, scale), plan=engine.plan(self.options), spec=spec)
        options = dict(self.options)
        if "gpu" in options:
            options["gpu"] = f"sm{options['gpu']}"
        if engine.differentiable:
            return engine.run(q, k, v, geom, options)
        with torch.no_grad(), fp32_matmuls(q.device):
            return engine.run(q, k, v, geom, options)


#: Parameters where 0 means "the engine decides" (tile by head dim, the split heuristic, no cascade).
_ZERO_MEANS_AUTO = ("tile", "splits", "cascade")


def parse_materializer(text: str) -> Materializer:
    """``"name[:key=int,...]"`` -> ``Materializer``; ``ValueError`` naming the bad part."""
    name, _, rest = text.strip().partition(":")
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} in {text!r}; known: {', '.join(ENGINES)}")
    allowed = ENGINES[name].params
    params, canonical = [], False
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{text!r}: {item!r} is not key=integer")
        number = int(value)
        if key == "canonical":
            canonical = bool(number)
            continue
        if key not in allowed:
            known = ", ".join([*allowed, "canonical"])
            raise ValueError(f"{text!r}: {name} has no parameter {key!r} (it takes {known})")
        if key == "gpu" and f"sm{number}" not in GPUS:
            raise ValueError(f"{text!r}: gpu={number} is not one of {', '.join(g[2:] for g in GPUS)}")
        if number < (0 if key in _ZERO_MEANS_AUTO else 1):
            raise ValueError(f"{text!r}: {key}={number} must be >= {0 if key in _ZERO_MEANS_AUTO else 1}")
        params.append((key, number))
    return Materializer(name, tuple(params), canonical)
