"""What each side's attention selector decides on, read from a recipe (torch-free).

Transformer Engine's ``get_attention_backend`` picks the training kernel and vLLM's CUDA platform
(``get_valid_backends``, then ``fa_utils.get_flash_attn_version``) the rollout kernel. Both decide
on a handful of facts; ``TrainingQuery`` and ``RolloutQuery`` are those facts as a recipe fixes
them for one kind of attention layer, ``Kernel`` is a selector's answer (the kernel, the
selector's own reasons, where the answer came from and what it assumed), ``KindKernel`` one layer
kind's answer and ``KernelPlan`` every kind's on both sides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: ``policy.precision`` -> the selectors' dtype names.
DTYPE_OF_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
#: A selector's dtype name -> its ``policy.precision`` name, which is also torch's.
PRECISION_OF_DTYPE = {dtype: precision for precision, dtype in DTYPE_OF_PRECISION.items()}
#: The flash-attn generations TE's ``NVTE_FLASH_ATTN_V2/_V3/_V4`` switch (TE 2.20 and later) and
#: vLLM's ``attention_config.flash_attn_version`` pin.
FLASH_GENERATIONS = (2, 3, 4)


def flash_pin_switches(generation: int) -> tuple[tuple[str, str], ...]:
    """The ``NVTE_FLASH_ATTN_V*`` switches that leave TE only flash-attn ``generation``."""
    return tuple((f"NVTE_FLASH_ATTN_V{g}", "1" if g == generation else "0") for g in FLASH_GENERATIONS)


def substantive(reasons: tuple[str, ...] | list[str]) -> list[str]:
    """A selector's reasons less those that only restate the NVTE switches of the backend asked for
    (all of them when nothing else is left)."""
    return [r for r in reasons if " due to NVTE_" not in r] or list(reasons)


@dataclass(frozen=True)
class TrainingQuery:
    """The inputs of TE's ``get_attention_backend`` that a NeMo-RL recipe fixes, per TP rank."""

    gpu: str
    backend: str  # the AttnBackend name: flash, fused, unfused or auto (local runs no TE)
    dtype: str  # bf16, fp16, fp32
    heads: int  # query heads on one tensor-parallel rank
    kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    window: int | None = None  # left sliding window; None: full causal
    softmax: str = "vanilla"  # TransformerConfig.softmax_type
    cp_size: int = 1
    qkv_format: str = "sbhd"  # thd: sequence packing
    deterministic: bool = False  # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
    flash_attn_3: bool = False  # flash-attn 3 (hopper build) installed beside flash-attn 2
    seq_len: int = 4096
    batch_size: int = 1
    #: NVTE_FLASH_ATTN_V2 / _V3 / _V4 in the worker environment (TE's finer switches), as (name, value).
    flash_switches: tuple[tuple[str, str], ...] = ()

    @property
    def head_dims(self) -> str:
        """``"192/128"``: the q/k and the v head dims."""
        return f"{self.head_dim_qk}/{self.head_dim_v}"

    @property
    def flash_pin(self) -> int | str | None:
        """The one flash-attn generation the ``NVTE_FLASH_ATTN_V*`` switches leave on (None: all of
        them, TE's default); the switches as written when they leave another set on."""
        switches = dict(self.flash_switches)
        on = [g for g in FLASH_GENERATIONS if switches.get(f"NVTE_FLASH_ATTN_V{g}", "1").strip() != "0"]
        if len(on) == len(FLASH_GENERATIONS):
            return None
        return on[0] if len(on) == 1 else ", ".join(f"{n}={v}" for n, v in self.flash_switches)


@dataclass(frozen=True)
class RolloutQuery:
    """The inputs of vLLM's CUDA attention selector that a NeMo-RL recipe fixes."""

    gpu: str
    dtype: str  # bf16, fp16, fp32
    head_size: int
    kv_cache_dtype: str = "auto"
    sliding_window: bool = False
    has_sink: bool = False  # attention sinks (gpt-oss)
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT in the worker environment
    heads: int = 16
    #: vllm_kwargs.attention_backend when the recipe forces one (vLLM then validates only it).
    forced_backend: str | None = None
    use_mla: bool = False  # multi-latent attention (head_size is then the latent plus its rotary part)
    use_sparse: bool = False  # sparse MLA (an indexer picks the keys: DeepSeek-V3.2, GLM-5)
    #: vllm_kwargs.attention_config.flash_attn_version: the flash-attn generation FLASH_ATTN is pinned to.
    flash_attn_version: int | None = None

    @property
    def mla(self) -> str:
        """``none``, ``mla`` or ``sparse``."""
        return "sparse" if self.use_sparse else "mla" if self.use_mla else "none"


@dataclass(frozen=True)
class Kernel:
    """One selector's answer for one side.

    ``kernel`` is the backend that runs (``FlashAttention``, ``FusedAttention``,
    ``UnfusedDotProductAttention``, ``FLASH_ATTN``, ``FLASHINFER``, ...; None: the selector finds
    none), ``version`` its flash-attn version or FusedAttention sub-backend, ``reasons`` the
    selector's own words for what it disabled, ``source`` where the answer came from (the selector
    run here, or the table generated from it), ``belief`` whether it rests on our stand-in for
    TE's C++ FusedAttention support check. ``pending`` says why there is no answer at all.
    """

    side: str
    kernel: str | None = None
    version: str | None = None
    reasons: tuple[str, ...] = ()
    source: str = ""
    assumptions: tuple[str, ...] = ()
    belief: bool = False
    pending: str | None = None

    @property
    def known(self) -> bool:
        """Whether a selector answered (a kernel, or that there is none)."""
        return self.pending is None

    @property
    def label(self) -> str:
        """One phrase: ``FlashAttention 2.8.3``, ``FusedAttention sub-backend 1``, ``no backend``, ``pending``."""
        if self.pending is not None:
            return "pending"
        if self.kernel is None:
            return "no backend"
        return f"{self.kernel} {self.version}" if self.version else self.kernel

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "side": self.side,
            "kernel": self.kernel,
            "version": self.version,
            "label": self.label,
            "reasons": list(self.reasons),
            "source": self.source,
            "assumptions": list(self.assumptions),
            "belief": self.belief,
            "pending": self.pending,
        }


@dataclass(frozen=True)
class KindKernel:
    """One kind of attention layer's kernel on one side: which layers, the selector's answer, its query."""

    layers: str
    kernel: Kernel
    query: TrainingQuery | RolloutQuery | None = None
    #: How many of the model's layers are of this kind (the kind covering the most is the side's main one).
    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the kernel's fields, the layers and the query."""
        return {"layers": self.layers, **self.kernel.to_dict(), "query": asdict(self.query) if self.query else None}


@dataclass(frozen=True)
class KernelPlan:
    """Both sides' kernels on one GPU generation, one per kind of attention layer (empty: no such side)."""

    gpu: str | None
    gpu_source: str
    training: tuple[KindKernel, ...] = ()
    rollout: tuple[KindKernel, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def pending(cls, gpu_source: str) -> KernelPlan:
        """The plan when no GPU is known (``gpu_source`` says why): nothing predicted yet."""
        return cls(None, gpu_source, notes=(f"kernels pending: {gpu_source}",))

    def kinds(self, side: str) -> tuple[KindKernel, ...]:
        return self.training if side == "training" else self.rollout

    def main(self, side: str) -> KindKernel | None:
        """The kind that covers the most layers on ``side`` (None: the side has no kernel to predict)."""
        kinds = self.kinds(side)
        return max(kinds, key=lambda kind: kind.count) if kinds else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "gpu": self.gpu,
            "gpu_source": self.gpu_source,
            "training": [kind.to_dict() for kind in self.training],
            "rollout": [kind.to_dict() for kind in self.rollout],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class KernelOptions:
    """How the kernels are asked for: flash-attn 3 installed beside flash-attn 2 (``--fa3``), the TE and
    vLLM versions whose tables answer (``--te`` / ``--vllm``; None: ``table_version`` chooses), the GPU
    ``check --gpu`` names (None: this machine's), and whether the selectors may run in this process
    (the GPU asked about is this machine's)."""

    flash_attn_3: bool = False
    te: str | None = None
    vllm: str | None = None
    live: bool = False
    gpu: str | None = None
