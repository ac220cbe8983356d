"""The kernel pair two bound records name: which kernel trains and which rolls out, on which GPUs,
whether they run one flash-attn generation, and the pairs the hosts document as mismatching.

Read from the contracts' ``backend``, ``flash_attention_version`` and ``gpu`` fields (a preview's
predicted or pending, a worker's observed or configured) with the vocabulary of the kernel
predictions (``kernels.kernel_query``), so ``check --gpu`` and a run's report say the same
thing of the same pair. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.kernels.kernel_pairs import flash_generation, pair_findings
from nemo_rl_attn_align.kernels.kernel_query import DTYPE_OF_PRECISION, Kernel, KernelPlan, KindKernel, RolloutQuery
from nemo_rl_attn_align.vocab.errors import Finding

_FLASH_KERNELS = ("FlashAttention", "FLASH_ATTN", "flash_attn")


@dataclass(frozen=True)
class KernelPair:
    """Both sides' kernels as their records say, their GPUs, whether they run one flash-attn
    generation (None: a side's kernel or flash-attn generation is not known), and the documented
    mismatching pairs they form (``KERNEL_PAIR_DOCUMENTED`` warnings)."""

    training: Kernel
    rollout: Kernel
    gpus: tuple[Any, Any]
    one_generation: bool | None
    documented: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "training": self.training.label,
            "rollout": self.rollout.label,
            "gpu": {"training": self.gpus[0], "rollout": self.gpus[1]},
            "one_generation": self.one_generation,
            "documented": [f.to_dict() for f in self.documented],
        }


def _kernel(contract: AttentionContract) -> Kernel:
    """The kernel a record names (pending when its backend is not known, or differs by layer)."""
    side, backend, version = contract.side, contract["backend"], contract["flash_attention_version"]
    if not backend.provenance.known or isinstance(backend.value, Mapping) or backend.value is None:
        return Kernel(side, pending=f"backend {backend.provenance.value}: {backend.source}")
    known = version.provenance.known and version.value is not None
    label = None if not known else str(version.value) if side == "training" else f"FA{version.value}"
    return Kernel(side, str(backend.value), label if backend.value in _FLASH_KERNELS else None, source=backend.source)


def _one_generation(training: Kernel, rollout: Kernel) -> bool | None:
    if not (training.known and rollout.known):
        return None
    generations = (flash_generation(training), flash_generation(rollout))
    flash = (training.kernel in _FLASH_KERNELS, rollout.kernel in _FLASH_KERNELS)
    if any(is_flash and generation is None for is_flash, generation in zip(flash, generations, strict=True)):
        return None  # a flash-attn kernel whose generation the record does not say
    return all(flash) and generations[0] == generations[1]


def _rollout_query(rollout: AttentionContract, gpu: str) -> RolloutQuery | None:
    """The selector query a rollout record answers (None: its dtype or head size is not known)."""
    dtype, head = rollout["dtype"], rollout["head_dim"]
    if not (dtype.provenance.known and head.provenance.known) or dtype.value not in DTYPE_OF_PRECISION.values():
        return None
    version = rollout["flash_attention_version"]
    return RolloutQuery(
        gpu,
        str(dtype.value),
        int(head.value),
        batch_invariant=rollout["batch_invariant"].value is True,
        flash_attn_version=version.value if version.provenance.known else None,
    )


def kernel_pair(training: AttentionContract, rollout: AttentionContract) -> KernelPair:
    """The pair ``training`` and ``rollout`` name; the documented pairs are matched on the rollout's
    GPU (else the training's), where the records name one."""
    t, r = _kernel(training), _kernel(rollout)
    gpus = (training["gpu"].value, rollout["gpu"].value)
    gpu = gpus[1] or gpus[0]
    documented: tuple[Finding, ...] = ()
    if isinstance(gpu, str) and t.known and r.known:
        query = _rollout_query(rollout, gpu)
        plan = KernelPlan(gpu, "the workers' records", (KindKernel("training", t),), (KindKernel("rollout", r, query),))
        documented = tuple(pair_findings(plan))
    return KernelPair(t, r, gpus, _one_generation(t, r), documented)
