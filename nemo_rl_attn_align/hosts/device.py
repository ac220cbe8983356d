"""The GPU a worker runs on, recorded in its contract (``gpu``), as the kernel tables name it.

Read from torch only where CUDA is already initialized in the worker's process (its engine has
loaded the model), so recording never initializes CUDA itself (a forked process could not).
"""

from __future__ import annotations

from nemo_rl_attn_align.contract.contract import AttentionContract, FieldValue
from nemo_rl_attn_align.kernels.gpu import of_capability


def device_gpu() -> FieldValue:
    """This process's GPU generation (observed), that it has none (observed null), or why it is not known."""
    try:
        import torch

        if not torch.cuda.is_available():
            return FieldValue.observed(None, "torch.cuda.is_available(): no CUDA device")
        if not torch.cuda.is_initialized():
            return FieldValue.unobservable(None, "CUDA is not initialized in this process when the record is written")
        major, minor = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    except Exception as err:  # observability: never breaks the worker
        return FieldValue.unobservable(None, f"torch.cuda: {type(err).__name__}: {err}")
    generation = of_capability(major, minor) or f"sm{major}{minor}"
    return FieldValue.observed(generation, f"torch.cuda.get_device_capability: {major}.{minor} ({name})")


def with_device(contract: AttentionContract) -> AttentionContract:
    """``contract`` with its ``gpu`` field read here, unless the worker's own reader set it."""
    if contract.fields["gpu"].provenance.known:
        return contract
    return AttentionContract(contract.side, contract.worker_id, {**contract.fields, "gpu": device_gpu()})
