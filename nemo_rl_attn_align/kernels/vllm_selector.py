"""vLLM's own CUDA attention selection, run in this process for one ``RolloutQuery``.

``select(query)`` asks vLLM's CUDA platform what it asks when an engine builds its attention layers
(vLLM 0.15 and later: ``CudaPlatformBase.get_valid_backends`` over an ``AttentionSelectorConfig``,
each backend's ``validate_configuration``, the lowest priority that validates; for ``FLASH_ATTN``
the flash-attn version from ``v1/attention/backends/fa_utils.get_flash_attn_version``), inside a
default current ``VllmConfig`` (``attention_config.flash_attn_version`` as the recipe pins it) and
with ``VLLM_BATCH_INVARIANT`` as the worker will have it. A
backend forced by ``vllm_kwargs.attention_backend`` is validated alone, as vLLM's
``get_attn_backend_cls`` does. The reasons are vLLM's own, for every backend of higher priority it
skipped. ``tests/real_vllm`` runs it on declared GPUs.
Imports torch and vLLM.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

from nemo_rl_attn_align.kernels.gpu import capability
from nemo_rl_attn_align.kernels.kernel_query import PRECISION_OF_DTYPE, Kernel, RolloutQuery


def unavailable() -> str | None:
    """Why vLLM's CUDA selector cannot run in this process (None: it can)."""
    try:
        from vllm.platforms import current_platform
        from vllm.platforms.cuda import CudaPlatformBase
        from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: F401
    except Exception as err:  # vLLM raises ImportError, RuntimeError, ... without its CUDA build
        return f"vLLM's CUDA selector does not load here ({type(err).__name__}: {err})"
    if not isinstance(current_platform, CudaPlatformBase):
        return f"vLLM runs on {type(current_platform).__name__} here, not CUDA"
    return None


@contextlib.contextmanager
def _batch_invariance(batch_invariant: bool) -> Iterator[None]:
    """``VLLM_BATCH_INVARIANT`` as the worker's environment sets it, for the block."""
    saved = os.environ.get("VLLM_BATCH_INVARIANT")
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_BATCH_INVARIANT", None)
        else:
            os.environ["VLLM_BATCH_INVARIANT"] = saved


@functools.cache
def _engine_config(batch_invariant: bool, flash_attn_version: int | None):
    """The ``VllmConfig`` an engine has under that batch invariance and with
    ``attention_config.flash_attn_version`` pinned (one per process and pair: making one takes longer
    than the selection itself)."""
    from vllm.config import VllmConfig

    with _batch_invariance(batch_invariant):
        config = VllmConfig()
    if flash_attn_version is not None:
        config.attention_config.flash_attn_version = flash_attn_version
    return config


def _unpinnable(query: RolloutQuery) -> str | None:
    """Why this vLLM cannot take ``query``'s flash-attn pin (None: no pin, or it can)."""
    if query.flash_attn_version is None:
        return None
    default = _engine_config(query.batch_invariant, None)
    fields = getattr(getattr(default, "attention_config", None), "__dataclass_fields__", {})
    if "flash_attn_version" in fields:
        return None
    return f"vLLM {version()} has no attention_config.flash_attn_version: the engine refuses the argument"


@contextlib.contextmanager
def _engine_context(query: RolloutQuery) -> Iterator[None]:
    """What an engine has while it builds its layers: a current ``VllmConfig`` (default, but for the
    flash-attn pin) and ``VLLM_BATCH_INVARIANT`` as the worker's environment sets it."""
    from vllm.config import set_current_vllm_config

    config = _engine_config(query.batch_invariant, query.flash_attn_version)
    with _batch_invariance(query.batch_invariant), set_current_vllm_config(config):
        yield


def _selector_config(query: RolloutQuery):
    """vLLM's ``AttentionSelectorConfig`` for ``query`` (fields the installed vLLM lacks are left out:
    it does not decide on them, e.g. ``has_sliding_window`` before 0.26)."""
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    values = {
        "head_size": query.head_size,
        "dtype": getattr(torch, PRECISION_OF_DTYPE[query.dtype]),
        "kv_cache_dtype": query.kv_cache_dtype,
        "block_size": None,
        "use_mla": query.use_mla,
        "use_sparse": query.use_sparse,
        "has_sink": query.has_sink,
        "has_sliding_window": query.sliding_window,
        "use_batch_invariant": query.batch_invariant,
    }
    return AttentionSelectorConfig(**{k: v for k, v in values.items() if k in AttentionSelectorConfig._fields})


def _flash_attn_version(query: RolloutQuery) -> str:
    from vllm.v1.attention.backends import fa_utils

    version = fa_utils.get_flash_attn_version(head_size=query.head_size, has_sinks=query.has_sink)
    return f"FA{version}" if version is not None else "FA?"


@functools.cache
def version() -> str:
    """The version of the vLLM Python this process imports (``vllm.__version__``: a CUDA wheel's sources
    on ``PYTHONPATH`` report theirs, not the installed distribution's)."""
    import vllm

    return str(vllm.__version__)


def _forced(name: str, device, config) -> tuple[object | None, tuple[str, ...]]:
    """(the backend, no reasons) when vLLM accepts ``name`` for ``config``, else (None, vLLM's reasons):
    ``get_attn_backend_cls`` validates a selected backend alone, and an import failure refuses it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if name not in AttentionBackendEnum.__members__:
        return None, (f"{name}: vLLM {version()} has no such attention backend (AttentionBackendEnum)",)
    forced = AttentionBackendEnum[name]
    try:
        reasons = forced.get_class().validate_configuration(device_capability=device, **config._asdict())
    except (ImportError, OSError) as err:
        reasons = [f"{type(err).__name__}: {err}"]
    return (None, tuple(f"{name}: {r}" for r in reasons)) if reasons else (forced, ())


def select(query: RolloutQuery) -> Kernel:
    """vLLM's choice for ``query`` on the GPU it reports, with its reasons."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    source = f"vLLM {version()}'s CUDA selector, run here"
    device = DeviceCapability(*capability(query.gpu))
    config = _selector_config(query)
    unpinnable = _unpinnable(query)
    if unpinnable is not None:
        return Kernel("rollout", None, None, (unpinnable,), source)
    with _engine_context(query):
        if query.forced_backend:
            chosen, reasons = _forced(query.forced_backend, device, config)
            if chosen is None:
                return Kernel("rollout", None, None, reasons, source)
        else:
            valid, invalid = type(current_platform).get_valid_backends(device, config, num_heads=query.heads)
            if not valid:
                reasons = tuple(
                    f"{b.name}: {', '.join(r)}" for b, (_, r) in sorted(invalid.items(), key=lambda i: i[1][0])
                )
                return Kernel("rollout", None, None, reasons, source)
            best = min(valid, key=lambda candidate: candidate.priority)
            chosen = best.backend
            skipped = sorted((p, b, r) for b, (p, r) in invalid.items() if p < best.priority)
            reasons = tuple(f"{b.name}: {', '.join(r)}" for _, b, r in skipped)
        name = chosen.name  # type: ignore[union-attr]
        detail = _flash_attn_version(query) if name == "FLASH_ATTN" else None
    if detail == "FA?" and query.flash_attn_version is not None:
        pin = query.flash_attn_version
        refused = f"FLASH_ATTN: flash-attn {pin} does not run here (fa_utils.get_flash_attn_version)"
        return Kernel("rollout", None, None, (*reasons, refused), source)
    return Kernel("rollout", name, detail, tuple(reasons), source)
