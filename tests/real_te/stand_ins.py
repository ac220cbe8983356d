"""Stand-ins for the parts of Transformer Engine that cannot load on a CPU machine, and nothing else.

Transformer Engine's Python (``transformer_engine``, the 1.2 MB ``transformer-engine`` wheel) is
real; it stays real down to these five stand-ins, each named in CONTRIBUTING.md:

1. ``transformer_engine_torch``, TE's compiled torch extension (``tex``): a module with TE's enums
   (names and values from TE's C++ headers, ``transformer_engine/common/util/pybind_helper.h`` and
   ``common/include/transformer_engine/*.h``) and, for every other name, a function that raises
   ``CompiledCoreMissing`` when called. ``load_framework_extension`` is replaced so that TE
   imports this module instead of the ``.so``; ``NVTE_PROJECT_BUILDING=1`` (TE's own switch)
   skips loading cuDNN, NVRTC, cuRAND and the core library.
2. The device: ``torch.cuda`` answers for a declared GPU (compute capability, SM count,
   ``is_available``, ``Stream``), tensors report ``is_cuda``, and tensors made on ``cuda`` are made
   on the CPU, inside ``declared_device``.
3. The cuDNN version: ``tex.get_cudnn_version`` returns the declared one (NeMo-RL main pins
   nvidia-cudnn-cu13 9.20.0).
4. The flash-attn packages present: ``FlashAttentionUtils`` is set the way TE's ``backends.py``
   sets it at import from the installed ``flash-attn`` / ``flash-attn-3`` / ``flash-attn-4``.
5. ``tex.get_fused_attn_backend``: cuDNN's support matrix is decided in TE's C++
   (``nvte_get_fused_attn_backend``). ``fused_backend_belief`` is OUR port of that C++ (TE main at
   d0067d0), not TE: every answer it gives says so (``BELIEF``).

Import this module before anything imports ``transformer_engine``.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, fields

#: Prefix of every reason the FusedAttention belief gives.
BELIEF = "belief (our port of TE's C++ nvte_get_fused_attn_backend, not TE)"
#: cuDNN of NeMo-RL main's pins (nvidia-cudnn-cu13==9.20.0.48).
DEFAULT_CUDNN = (9, 20, 0)


class CompiledCoreMissing(RuntimeError):
    """A function of TE's compiled extension was called; it does not exist on this machine."""


def _enum(name: str, members: list[str] | dict[str, int], start: int = 0) -> type[enum.IntEnum]:
    values = members if isinstance(members, dict) else {m: i + start for i, m in enumerate(members)}
    return enum.IntEnum(name, values)


_LAYOUTS = (
    "SB3HD SBH3D SBHD_SB2HD SBHD_SBH2D SBHD_SBHD_SBHD BS3HD BSH3D BSHD_BS2HD BSHD_BSH2D BSHD_BSHD_BSHD "
    "T3HD TH3D THD_T2HD THD_TH2D THD_THD_THD SBHD_BSHD_BSHD BSHD_SBHD_SBHD THD_BSHD_BSHD THD_SBHD_SBHD "
    "Paged_KV_BSHD_BSHD_BSHD Paged_KV_BSHD_SBHD_SBHD Paged_KV_SBHD_BSHD_BSHD Paged_KV_SBHD_SBHD_SBHD "
    "Paged_KV_THD_BSHD_BSHD Paged_KV_THD_SBHD_SBHD BHSD_BHSD_BHSD"
).split()

#: TE's pybind enums (``fused_attn.h``, ``transformer_engine.h``, ``pybind.cpp``), name -> members.
ENUMS: dict[str, list[str] | dict[str, int]] = {
    "DType": {
        "kByte": 0,
        "kInt32": 2,
        "kFloat32": 4,
        "kFloat16": 5,
        "kBFloat16": 6,
        "kFloat8E4M3": 7,
        "kFloat8E5M2": 8,
        "kFloat4E2M1": 10,
    },
    "NVTE_Bias_Type": ["NVTE_NO_BIAS", "NVTE_PRE_SCALE_BIAS", "NVTE_POST_SCALE_BIAS", "NVTE_ALIBI"],
    "NVTE_Mask_Type": [
        "NVTE_NO_MASK",
        "NVTE_PADDING_MASK",
        "NVTE_CAUSAL_MASK",
        "NVTE_PADDING_CAUSAL_MASK",
        "NVTE_CAUSAL_BOTTOM_RIGHT_MASK",
        "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
    ],
    "NVTE_Softmax_Type": ["NVTE_VANILLA_SOFTMAX", "NVTE_OFF_BY_ONE_SOFTMAX", "NVTE_LEARNABLE_SOFTMAX"],
    "NVTE_QKV_Format": {
        "NVTE_SBHD": 0,
        "NVTE_BSHD": 1,
        "NVTE_THD": 2,
        "NVTE_BSHD_2SBHD": 3,
        "NVTE_SBHD_2BSHD": 4,
        "NVTE_THD_2BSHD": 5,
        "NVTE_THD_2SBHD": 6,
        "NVTE_BHSD": 7,
        "NVTE_QKV_Format_NOT_SET": 8,
    },
    "NVTE_QKV_Layout": {**{f"NVTE_{n}": i for i, n in enumerate(_LAYOUTS)}, "NVTE_QKV_Layout_NOT_SET": 26},
    "NVTE_Fused_Attn_Backend": {"NVTE_No_Backend": -1, "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2},
    "NVTEScalingMode": [
        "NVTE_DELAYED_TENSOR_SCALING",
        "NVTE_MXFP8_1D_SCALING",
        "NVTE_BLOCK_SCALING_1D",
        "NVTE_BLOCK_SCALING_2D",
        "NVTE_NVFP4_1D_SCALING",
    ],
    "Float8BlockScaleTensorFormat": ["GEMM_READY", "COMPACT", "INVALID"],
    "CommOverlapType": ["RS", "AG"],
    "CommOverlapAlgo": [
        "BULK_OVERLAP_AG",
        "BULK_OVERLAP_RS",
        "SPLIT_PIPELINED_AG_P2P",
        "SPLIT_PIPELINED_RS",
        "SPLIT_PIPELINED_RS_P2P",
        "ATOMIC_GEMM_RS",
        "ATOMIC_GEMM_AG_P2P",
        "ATOMIC_GEMM_RS_P2P",
        "EXTERNAL_BULK_OVERLAP_AG",
    ],
    "FP8FwdTensors": [f"GEMM{i}_{t}" for i in (1, 2, 3) for t in ("INPUT", "WEIGHT", "OUTPUT")],
    "FP8BwdTensors": [f"GRAD_{t}{i}" for i in (1, 2, 3) for t in ("OUTPUT", "INPUT")],
    "NVTERoutingMapFormat": ["BYTEMAP", "BITMAP_U8"],
    "NVTEQBHistogramMode": ["TWO_KERNEL", "FUSED_ATOMIC"],
}
#: pybind classes TE's Python names at import (subclassed or used in annotations).
CLASSES = ("CommOverlap", "CommOverlapHelper", "CommOverlapP2P", "CommOverlapCore", "CommOverlapBase", "FP8TensorMeta")


@dataclass
class Device:
    """The GPU declared for this process: what ``torch.cuda`` and TE's extension report."""

    capability: tuple[int, int] = (9, 0)
    multi_processor_count: int = 132
    cudnn: tuple[int, int, int] = DEFAULT_CUDNN

    @property
    def name(self) -> str:
        return f"declared sm{self.capability[0]}{self.capability[1]}"


#: The device ``declared_device`` sets; read by the stand-in extension.
current = Device()


class _CompiledExtension(types.ModuleType):
    """``transformer_engine_torch``: TE's enums; any other name a function that raises when called."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def compiled(*args, **kwargs):
            raise CompiledCoreMissing(f"transformer_engine_torch.{name} is TE's compiled core (stand-in: not here)")

        compiled.__name__ = name
        setattr(self, name, compiled)
        return compiled


def _cudnn_encoded() -> int:
    major, minor, patch = current.cudnn
    return major * 10000 + minor * 100 + patch


def _installed_te_names_max512() -> bool:
    """Whether the installed TE's Python still names FusedAttention sub-backend 0 (``F16_max512_seqlen``,
    dropped after TE 2.15); TE asserts its Python and C++ enums have the same members."""
    spec = importlib.util.find_spec("transformer_engine")
    origin = spec.origin if spec is not None else None
    path = os.path.join(os.path.dirname(origin), "pytorch", "cpp_extensions", "fused_attn.py") if origin else ""
    try:
        with open(path, encoding="utf-8") as source:
            return "F16_max512_seqlen" in source.read()
    except OSError:
        return False


def make_extension() -> types.ModuleType:
    """A fresh stand-in ``transformer_engine_torch`` module, its enums matching the installed TE."""
    tex = _CompiledExtension("transformer_engine_torch")
    tex.__spec__ = importlib.machinery.ModuleSpec("transformer_engine_torch", None)
    enums = dict(ENUMS)
    if _installed_te_names_max512():
        enums["NVTE_Fused_Attn_Backend"] = {**ENUMS["NVTE_Fused_Attn_Backend"], "NVTE_F16_max512_seqlen": 0}
    for name, members in enums.items():
        setattr(tex, name, _enum(name, members))
    for name in CLASSES:
        setattr(tex, name, type(name, (), {"__module__": "transformer_engine_torch"}))
    tex.get_cudnn_version = _cudnn_encoded
    tex.get_fused_attn_backend = _get_fused_attn_backend
    return tex


def install() -> None:
    """Make ``import transformer_engine.pytorch`` load the real Python over the stand-in extension (idempotent)."""
    if isinstance(sys.modules.get("transformer_engine_torch"), _CompiledExtension):
        return
    os.environ.setdefault("NVTE_PROJECT_BUILDING", "1")
    sys.modules["transformer_engine_torch"] = make_extension()
    import transformer_engine.common as te_common

    te_common.load_framework_extension = lambda framework: None


# -- 2-4: the declared device --------------------------------------------------------------------


def _props(device=None):
    return types.SimpleNamespace(
        major=current.capability[0],
        minor=current.capability[1],
        name=current.name,
        multi_processor_count=current.multi_processor_count,
        total_memory=80 << 30,
    )


def _cuda_on_cpu_mode():
    """A torch function mode that makes the tensors TE asks on ``cuda`` on the CPU instead."""
    import torch

    def on_cpu(value):
        return "cpu" if isinstance(value, (str, torch.device)) and str(value).startswith("cuda") else value

    class CudaOnCpu(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.cuda:
                return args[0]
            kwargs = {k: on_cpu(v) if k == "device" else v for k, v in (kwargs or {}).items()}
            if func is torch.Tensor.to:
                args = tuple(on_cpu(a) for a in args)
            return func(*args, **kwargs)

    return CudaOnCpu()


class _Stream:
    """``torch.cuda.Stream`` of the declared device (megatron-core makes one for context parallelism)."""

    def __init__(self, *args, **kwargs):
        self.device = "cuda:0"


def _clear_te_caches() -> None:
    from transformer_engine.pytorch import utils

    for name in ("_get_device_compute_capability", "_get_cudnn_version"):
        cached = getattr(utils, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextlib.contextmanager
def declared_device(
    capability: tuple[int, int] = (9, 0),
    *,
    sms: int | None = None,
    cudnn: tuple[int, int, int] = DEFAULT_CUDNN,
    flash_attn: str | None = "2.8.3",
    flash_attn_3: str | None = None,
    flash_attn_3_softcap: bool = True,
) -> Iterator[Device]:
    """Inside: ``torch.cuda`` reports the declared GPU, tensors report ``is_cuda``, TE sees the cuDNN
    version and the flash-attn packages named (``None``: not installed). Restored on exit."""
    import torch

    global current
    saved_device = current
    current = Device(capability, sms or {8: 108, 9: 132, 10: 148}.get(capability[0], 108), cudnn)
    patched = {
        "is_available": lambda: True,
        "current_device": lambda: 0,
        "device_count": lambda: 1,
        "get_device_properties": _props,
        "get_device_capability": lambda device=None: current.capability,
        "get_device_name": lambda device=None: current.name,
        "Stream": _Stream,
    }
    saved_cuda = {name: getattr(torch.cuda, name) for name in patched}
    had_is_cuda = "is_cuda" in torch.Tensor.__dict__
    saved_fa = _flash_attn_state()
    try:
        for name, value in patched.items():
            setattr(torch.cuda, name, value)
        torch.Tensor.is_cuda = property(lambda self: True)  # type: ignore[assignment,method-assign]
        _clear_te_caches()
        declare_flash_attn(flash_attn, flash_attn_3, flash_attn_3_softcap)
        with _cuda_on_cpu_mode():
            yield current
    finally:
        for name, value in saved_cuda.items():
            setattr(torch.cuda, name, value)
        if not had_is_cuda:
            del torch.Tensor.is_cuda
        _restore_flash_attn(saved_fa)
        current = saved_device
        _clear_te_caches()


def _fa_utils():
    from transformer_engine.pytorch.attention.dot_product_attention.utils import FlashAttentionUtils

    return FlashAttentionUtils


def _flash_attn_state() -> dict:
    fa = _fa_utils()
    return {k: v for k, v in vars(fa).items() if not k.startswith("__") and not callable(v)}


def _restore_flash_attn(state: dict) -> None:
    fa = _fa_utils()
    for name, value in state.items():
        setattr(fa, name, value)


def declare_flash_attn(fa2: str | None, fa3: str | None, fa3_softcap: bool = True) -> None:
    """Set ``FlashAttentionUtils`` as TE's ``backends.py`` does at import for these installed versions."""
    from packaging.version import Version

    fa = _fa_utils()
    fa.is_installed, fa.v3_is_installed, fa.v4_is_installed = False, False, False
    fa.version, fa.fa3_version = Version("0"), Version("0")
    if fa2 is not None:
        fa.version = Version(fa2)
        required = fa.version_required_blackwell if current.capability >= (10, 0) else fa.version_required
        if hasattr(fa, "is_version_supported"):  # TE >= 2.16
            supported = fa.is_version_supported(fa.version, required)
        else:
            supported = required <= fa.version <= fa.max_version
        if supported:
            fa.set_flash_attention_version()
    if fa3 is not None:
        fa.fa3_version = Version(Version(fa3).public)
        fa.set_flash_attention_3_params()
        fa.fa3_supports_softcap = fa3_softcap


# -- 5: the FusedAttention sub-backend (our belief of TE's C++) ------------------------------------

F16_ARBITRARY, NO_BACKEND = 1, -1
_DIGITS = str.maketrans("", "", "0123456789")


def _formats(layout_name: str) -> tuple[str, str, bool]:
    """``NVTE_THD_BSHD_BSHD`` -> (q format, kv format, paged)."""
    name = layout_name.removeprefix("NVTE_")
    parts = name.removeprefix("Paged_KV_").split("_")
    return parts[0].translate(_DIGITS).lower(), parts[-1].translate(_DIGITS).lower(), name.startswith("Paged_KV_")


@dataclass(frozen=True)
class FusedQuery:
    """The inputs ``nvte_get_fused_attn_backend`` decides on, by name."""

    is_training: bool
    dtype: str  # kBFloat16, kFloat16, kFloat8E4M3, ...
    layout: str  # NVTE_QKV_Layout member name
    bias: str
    mask: str
    softmax: str
    dropout: float
    heads: int
    gqa: int
    sq: int
    skv: int
    d_qk: int
    d_v: int
    window_left: int
    window_right: int
    deterministic: bool


def fused_backend_belief(q: FusedQuery, sm: int, cudnn: tuple[int, int, int]) -> tuple[int, str]:
    """Our port of TE's C++ F16/BF16 arbitrary-seqlen support matrix; (sub-backend, reason)."""
    cudnn_v = cudnn[0] * 10000 + cudnn[1] * 100 + cudnn[2]
    q_fmt, kv_fmt, paged = _formats(q.layout)
    thd = "thd" in (q_fmt, kv_fmt)
    no_bias, no_dropout = q.bias == "NVTE_NO_BIAS", q.dropout == 0.0
    window = not (q.window_left == -1 and q.window_right in (-1, 0))

    def no(why: str) -> tuple[int, str]:
        return NO_BACKEND, f"{BELIEF}: {why}"

    if q.dtype not in ("kFloat16", "kBFloat16"):
        return no(f"qkv dtype {q.dtype} is not fp16/bf16 (the FP8 branch is not modelled)")
    if not (80 <= sm < 100 or (sm >= 100 and cudnn_v >= 90700)):
        return no(f"sm{sm} with cuDNN {cudnn_v} has no F16 arbitrary-seqlen kernel")
    if q.d_qk % 8 or q.d_v % 8:
        return no(f"head_dim {q.d_qk}/{q.d_v} is not a multiple of 8")
    if max(q.d_qk, q.d_v) > 128:
        hopper = q.d_qk <= 256 and q.d_v <= 256 and sm == 90 and cudnn_v >= (90500 if q.is_training else 90100)
        blackwell_256 = (
            q.d_qk == q.d_v == 256
            and q.is_training
            and 100 <= sm < 110
            and cudnn_v >= (92500 if thd else 92300)
            and not paged
            and no_bias
            and no_dropout
            and q.softmax == "NVTE_VANILLA_SOFTMAX"
        )
        blackwell_fprop = not q.is_training and sm >= 100 and cudnn_v >= 90900 and q.sq > 1
        if not (hopper or blackwell_256 or blackwell_fprop):
            return no(
                f"head_dim {max(q.d_qk, q.d_v)} > 128 needs sm90 (cuDNN >= 9.5 for training) or sm100 "
                f"with head_dim 256 and cuDNN >= {'9.25' if thd else '9.23'}"
            )
    if thd and sm < 90:
        return no("qkv_format thd needs sm90 or later")
    if thd and q.heads != q.gqa and cudnn_v < 90600:
        return no("thd with grouped-query attention needs cuDNN >= 9.6")
    if window and not (q.sq <= q.skv and no_bias and no_dropout):
        return no("sliding window needs s_q <= s_kv, no bias and no dropout")
    if cudnn_v in (91000, 91001):
        return no("cuDNN 9.10.0/9.10.1 have known bugs in F16 SDPA")
    if q.softmax != "NVTE_VANILLA_SOFTMAX" and cudnn_v < 91301:
        return no(f"softmax {q.softmax} needs cuDNN >= 9.13.1")
    if sm >= 100 and q.is_training and q.deterministic and not (cudnn_v >= 91801 and no_dropout and no_bias):
        return no("deterministic training backward on Blackwell needs cuDNN >= 9.18.1, no dropout, no bias")
    if sm == 120 and cudnn_v < 91801:
        return no("sm120 needs cuDNN >= 9.18.1")
    return F16_ARBITRARY, ""


def _name(enum_value) -> str:
    return enum_value.name if hasattr(enum_value, "name") else str(enum_value)


#: How often TE consulted ``_get_fused_attn_backend`` (a selection that did rests on ``BELIEF``).
fused_consultations = 0


def _get_fused_attn_backend(*args):
    """``tex.get_fused_attn_backend``: TE >= 2.16 passes one ``FusedAttentionParams`` and expects
    ``(backend, reject message)``; TE 2.14-2.15 passes 19 positional values and expects the backend."""
    global fused_consultations
    fused_consultations += 1
    tex = sys.modules["transformer_engine_torch"]
    sm = current.capability[0] * 10 + current.capability[1]
    if len(args) == 1:
        p = args[0]
        values = {f.name: getattr(p, f.name) for f in fields(p)}
        query = FusedQuery(
            bool(values["is_training"]),
            _name(values["qkv_dtype"])
            if not isinstance(values["qkv_dtype"], int)
            else _dtype_name(values["qkv_dtype"]),
            _name(values["qkv_layout"]),
            _name(values["bias_type"]),
            _name(values["attn_mask_type"]),
            _name(values["softmax_type"]),
            float(values["dropout"]),
            values["num_attn_heads"],
            values["num_gqa_groups"],
            values["max_seqlen_q"],
            values["max_seqlen_kv"],
            values["head_dim_qk"],
            values["head_dim_v"],
            values["window_size_left"],
            values["window_size_right"],
            bool(values["deterministic"]),
        )
        backend, why = fused_backend_belief(query, sm, current.cudnn)
        return tex.NVTE_Fused_Attn_Backend(backend), why
    (training, q_dtype, _kv, layout, bias, mask, softmax, dropout, heads, gqa, sq, skv, dqk, dv, wl, wr) = args[:16]
    query = FusedQuery(
        bool(training),
        _dtype_name(q_dtype),
        _name(layout),
        _name(bias),
        _name(mask),
        _name(softmax),
        float(dropout),
        heads,
        gqa,
        sq,
        skv,
        dqk,
        dv,
        wl,
        wr,
        bool(args[18]),
    )
    return tex.NVTE_Fused_Attn_Backend(fused_backend_belief(query, sm, current.cudnn)[0])


def _dtype_name(value) -> str:
    tex = sys.modules["transformer_engine_torch"]
    return tex.DType(int(value)).name
