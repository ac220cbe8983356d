"""The drift sweep's attention shape and defaults, read from a NeMo-RL config (torch-free).

Attention shapes come, field by field, from the first of: explicit flags, the config's
``attention_align.drift`` block, and the model's main kind of attention layer as Megatron builds
it (``RecipeFacts.model``: the hosts' own reading of its local ``config.json``, with
``hf_config_overrides`` and ``model_overrides`` applied; the kind covering the most layers).
``kv_heads`` defaults to ``heads`` (MHA) and ``window`` to none (full causal), as in Megatron and
Hugging Face. A kind the replays do not model (softmax sinks, multi-latent attention's separate v
head dim, a logit soft cap) is said so, never swept as plain attention. The public functions take the recipe's
``RecipeFacts``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.kernels.gpu import capability
from nemo_rl_attn_align.kernels.kernel_query import DTYPE_OF_PRECISION, Kernel, KernelPlan
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import LayerKind
from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND
from nemo_rl_attn_align.preflight.facts import UNSET
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.vocab.errors import UsageError

#: dtypes the sweep runs (``sweep.DTYPES`` maps them to torch): ``policy.precision``'s, by their short names.
DTYPE_NAMES = tuple(DTYPE_OF_PRECISION.values())
DEFAULT_DTYPES = DTYPE_NAMES
#: The GPU plans are selected for when ``--gpu`` names none (any of ``kernels.gpu.GPUS``); NeMo-RL's
#: recipes target Hopper.
DEFAULT_GPU = "sm90"
#: Training engines swept when the config names no backend of its own (``default_engines``); the
#: unfused ``megatron-local`` and ``hf-eager`` are a flag away (each builds the full score matrix).
DEFAULT_TRAINING = ("reference", "te-p2p:cp=2", "te-p2p-bshd:cp=2", "te-allgather:cp=2", "flash")
DEFAULT_CHUNK = 256
DEFAULT_SEQ_LEN = 1024
DEFAULT_VOCAB = 512


@dataclass
class Shape:
    """One attention layer's shape and where each field came from."""

    heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    seq_len: int
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "window": self.window,
            "seq_len": self.seq_len,
            "sources": dict(self.sources),
        }


def main_kind(facts: RecipeFacts) -> tuple[LayerKind | None, str]:
    """The model's kind of attention layer covering the most layers (Megatron's build where Megatron
    trains, else vLLM's), and where it was read; or None and why no kind is known."""
    why = []
    for side in ("training",) if facts.megatron_enabled else ("rollout", "training"):
        model = facts.model.side(side)
        if isinstance(model, NotRead):
            why.append(f"{side}: {model.why}")
            continue
        if model.kinds:
            kind = max(model.kinds, key=lambda k: len(k.layers))
            return kind, f"{model.source}, {kind.describe(model.num_layers)}"
        why.append(f"{side}: {model.source} has no softmax attention layer")
    return None, facts.model.unread or "; ".join(why)


def _sources(facts: RecipeFacts) -> list[tuple[str, dict]]:
    """Candidate ``(name, {field: value})`` layers, highest priority first (flags excluded)."""
    layers = [(layer.key, dict(layer.value)) for layer in facts.shape.layers]
    kind, where = main_kind(facts)
    if kind is not None:
        layers.append(
            (
                where,
                {"heads": kind.heads, "kv_heads": kind.kv_heads, "head_dim": kind.head_dim_qk, "window": kind.window},
            )
        )
    seq = facts.shape.seq_len
    if seq is not None:
        layers.append((seq.key, {"seq_len": seq.value}))
    return layers


def unreplayed(kind: LayerKind) -> str | None:
    """What of ``kind``'s attention the replays do not model (None: a plain softmax they replay)."""
    if kind.mla is not None or kind.head_dim_qk != kind.head_dim_v:
        return f"multi-latent attention (q/k head dim {kind.head_dim_qk}, v head dim {kind.head_dim_v})"
    if kind.sinks:
        return f"{kind.softmax} softmax sinks"
    if kind.softcap:
        return f"a logit soft cap of {kind.softcap:g}"
    return None


def _positive_int(name: str, value: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        flag = "--" + name.replace("_", "-")
        raise UsageError(f"{where}: {name}={value!r} is not a positive integer. Fix: pass {flag} N or correct {where}.")
    return value


def resolve_shape(facts: RecipeFacts, flags: dict[str, Any]) -> Shape:
    """Attention shape for the sweep: flags > the ``attention_align.drift`` block > the model's main kind."""
    layers = [("flags", {k: v for k, v in flags.items() if v is not None}), *_sources(facts)]
    picked: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in ("heads", "kv_heads", "head_dim", "window", "seq_len", "hidden"):
        for where, values in layers:
            if values.get(name) is not None:
                picked[name], sources[name] = values[name], where
                break
    kind, where = main_kind(facts)
    if "heads" not in picked:
        raise UsageError(
            f"attention shape unknown: {where}. "
            "Fix: pass --heads N --kv-heads N --head-dim N (and --window N for sliding-window models)."
        )
    if kind is not None and sources["heads"] == where and (missing := unreplayed(kind)) is not None:
        raise UsageError(
            f"the model's attention has {missing}, which the replays do not model. "
            "Fix: pass --heads N --kv-heads N --head-dim N to sweep plain attention of a size you choose."
        )
    heads = _positive_int("heads", picked["heads"], sources["heads"])
    if "kv_heads" not in picked:
        picked["kv_heads"], sources["kv_heads"] = heads, "default (= heads)"
    if "head_dim" not in picked and "hidden" in picked:
        hidden = _positive_int("hidden_size", picked["hidden"], sources["hidden"])
        picked["head_dim"], sources["head_dim"] = hidden // heads, f"{sources['hidden']} hidden_size // heads"
    if "head_dim" not in picked:
        raise UsageError(f"head dim unknown for heads={heads} ({sources['heads']}). Fix: pass --head-dim N.")
    kv_heads = _positive_int("kv_heads", picked["kv_heads"], sources["kv_heads"])
    if heads % kv_heads:
        raise UsageError(
            f"heads={heads} is not a multiple of kv_heads={kv_heads}. Fix: pass matching --heads and --kv-heads."
        )
    window = picked.get("window")
    if window is not None:
        window = _positive_int("window", window, sources["window"], allow_zero=True)
    else:
        sources["window"] = sources.get("window", "default (none)")
    seq_len = picked.get("seq_len", DEFAULT_SEQ_LEN)
    sources.setdefault("seq_len", "default")
    sources.pop("hidden", None)
    return Shape(
        heads,
        kv_heads,
        _positive_int("head_dim", picked["head_dim"], sources["head_dim"]),
        window,
        _positive_int("seq_len", seq_len, sources["seq_len"]),
        sources,
    )


def default_rollout(engine: str | None, seq_len: int, window: int | None) -> list[str]:
    """vLLM's path through ``engine`` (a vLLM materializer; None: none replays it): chunked prefill,
    and cascade past a shared prompt of half the sequence (not with a window)."""
    if engine is None:
        return ["reference"]
    prompt = seq_len // 2 // DEFAULT_CHUNK * DEFAULT_CHUNK
    plans = [f"{engine}:chunk={DEFAULT_CHUNK}"]
    if prompt and window is None:
        plans.append(f"{engine}:chunk={DEFAULT_CHUNK},cascade={prompt}")
    return ["reference", *plans]


def _training_engines(kernel: str | None, cp: int, window: int | None) -> list[str]:
    """The materializers of TE ``kernel`` with context parallel size ``cp`` (NeMo-RL packs sequences
    there, so flash is TE's thd p2p ring, its bshd figure beside it; a window rules the ring out)."""
    if kernel == "FusedAttention":
        return ["te-fused"]
    if kernel != "FlashAttention":
        return []  # TE's unfused attention (or none): not replayed
    if cp > 1:
        return [f"te-p2p:cp={cp}", f"te-p2p-bshd:cp={cp}"] if window is None else [f"te-allgather:cp={cp}"]
    return ["flash"]


#: The vLLM materializers, by the FLASH_ATTN build and GPU whose tiles they replay (other GPUs and
#: kernels leave the rollout side to the reference).
ROLLOUT_REPLAYS = {("FA3", "sm90"): "vllm-fa3", ("FA2", "sm80"): "vllm"}


def _rollout_engine(kernel: Kernel | None, gpu: str) -> str | None:
    """The vLLM materializer replaying ``kernel`` on ``gpu``, None when none does."""
    if kernel is None or kernel.kernel != "FLASH_ATTN":
        return None
    return ROLLOUT_REPLAYS.get((kernel.version or "", gpu))


@dataclass(frozen=True)
class EnginePrediction:
    """One side's engines for drift: the specs swept (the reference first), the kernel they follow
    (None: not chosen by a kernel prediction), whether it was assumed and why (the selector's source,
    or why its answer is pending), and, where no materializer replays it, what is not replayed
    (None then: no backend at all)."""

    side: str
    specs: tuple[str, ...]
    kernel: Kernel | None = None
    assumed: bool = False
    why: str = ""
    unreplayed: str | None = None

    @property
    def engines(self) -> tuple[str, ...]:
        """The specs beside the reference."""
        return tuple(spec for spec in self.specs if spec != "reference")

    @property
    def label(self) -> str:
        """The kernel in one phrase (``Kernel.label``)."""
        return self.kernel.label if self.kernel is not None else "unknown kernel"

    @property
    def assumption(self) -> str:
        """What was assumed and why (for an assumed kernel)."""
        return f"assumed {self.label}: the selector's answer is pending ({self.why})"

    def notes(self) -> list[str]:
        """The lines ``drift`` prints: where the kernel came from, and a side left to the reference."""
        notes = []
        if self.kernel is not None:
            notes.append(
                f"{self.side} kernel {self.assumption}"
                if self.assumed
                else f"{self.side} kernel: {self.label} ({self.why})"
            )
        if not self.engines:
            replayed = self.unreplayed or "a missing backend"
            notes.append(f"no materializer replays {replayed}: the {self.side} side is the reference only")
        return notes


def _assumed_rollout(gpu: str) -> Kernel:
    """vLLM's FLASH_ATTN build where its selector cannot answer (a shape outside the tables): FA3 on sm90 only."""
    return Kernel("rollout", "FLASH_ATTN", "FA3" if gpu == "sm90" else "FA2")


def _assumed_training(backend: str, gpu: str) -> Kernel:
    """TE's class for ``backend`` where its selector cannot answer (auto: cuDNN from sm90 on, flash-attn before)."""
    fallback = "FusedAttention" if capability(gpu) >= (9, 0) else "FlashAttention"
    return Kernel("training", TE_CLASS_BY_BACKEND.get(backend, fallback))


def _predicted(plan: KernelPlan, side: str, assumed: Kernel) -> tuple[Kernel, bool, str]:
    """``plan``'s kernel for ``side``'s main layer kind when a selector answered (and its source), else
    ``assumed`` and why."""
    main = plan.main(side)
    kernel = main.kernel if main is not None else None
    if kernel is not None and kernel.known:
        return kernel, False, kernel.source
    why = str(kernel.pending) if kernel is not None else "; ".join(n for n in plan.notes if f" {side} " in n)
    return assumed, True, why


def default_engines(
    facts: RecipeFacts, gpu: str, shape: Shape, environ: Mapping[str, str] | None = None
) -> tuple[EnginePrediction, EnginePrediction]:
    """``(training, rollout)``: the engines the recipe runs on ``gpu`` (torch-free).

    They follow the kernels ``check --gpu`` predicts (``kernels.kernel_prediction``, from TE's and vLLM's own
    selectors): FlashAttention -> ``flash`` (the CP rings with ``context_parallel_size > 1``),
    FusedAttention -> ``te-fused``, ``transformer_impl: local`` -> Megatron's own attention; vLLM
    FLASH_ATTN FA3 on sm90 -> ``vllm-fa3``, FA2 on sm80 -> ``vllm`` (``ROLLOUT_REPLAYS``). Where a
    selector cannot answer (a shape outside the tables) assumptions stand in, and the prediction says
    so; a kernel no materializer replays leaves its side to the reference. A config without
    ``megatron_cfg`` sweeps ``DEFAULT_TRAINING`` against vLLM's kernel.
    """
    from nemo_rl_attn_align.kernels.kernel_prediction import plan_kernels

    policy = facts.policy
    plan = plan_kernels(facts, gpu, "--gpu", os.environ if environ is None else environ)
    kernel, assumed, why = _predicted(plan, "rollout", _assumed_rollout(gpu))
    engine = _rollout_engine(kernel, gpu)
    specs = tuple(default_rollout(engine, shape.seq_len, shape.window))
    rollout = EnginePrediction("rollout", specs, kernel, assumed, why, f"{kernel.label} on {gpu}")
    # An absent ``enabled`` counts as Megatron here: drift replays the engines the section names.
    if policy is None or not policy.has_megatron_cfg or not (policy.enabled_raw is UNSET or policy.enabled_raw):
        specs = tuple(t for t in DEFAULT_TRAINING if not (shape.window is not None and "p2p" in t))
        return EnginePrediction("training", specs), rollout
    if policy.transformer_impl == "local" or policy.effective_backend == "local":
        return EnginePrediction("training", ("reference", "megatron-local")), rollout
    assumption = _assumed_training(policy.effective_backend or "auto", gpu)
    kernel, assumed, why = _predicted(plan, "training", assumption)
    specs = ("reference", *_training_engines(kernel.kernel, policy.context_parallel_size, shape.window))
    return EnginePrediction("training", specs, kernel, assumed, why, kernel.kernel), rollout


def parse_dtypes(text: str) -> list[str]:
    """``"bf16,fp32"`` -> ``["bf16", "fp32"]``; UsageError on an unknown name."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in DTYPE_NAMES]
    if bad or not names:
        raise UsageError(
            f"--dtypes {text!r}: unknown dtype {bad[0] if bad else '(empty)'}. "
            f"Fix: a comma list of {', '.join(DTYPE_NAMES)}."
        )
    return names
