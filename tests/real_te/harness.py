"""Megatron's core attention built as a recipe builds it, run by real Transformer Engine on a declared GPU.

``run(case)`` builds megatron-core's ``TEDotProductAttention`` from the TE layer spec
(``get_gpt_layer_with_transformer_engine_spec``, the spec NeMo-RL's Megatron models use) with the
arguments megatron-core's ``Attention.__init__`` passes, after Megatron's own
``LanguageModule._set_attention_backend`` has set the NVTE variables for ``attention_backend``, and
calls its forward with the tensors Megatron feeds it (``sbhd``, or ``thd`` with the
``PackedSeqParams`` NeMo-RL's sequence packing builds: padded ``cu_seqlens`` passed as both the
plain and the padded boundaries). TE's real ``DotProductAttention.forward`` gathers the attention
parameters and runs its real ``get_attention_backend``; only the three kernels it dispatches to
(``flash_attention``, ``fused_attention``, ``unfused_attention`` submodules) are stand-ins that
record their call and return zeros of the output's shape, since no kernel runs on a CPU.
Context parallelism runs in one process on torch's fake process group (world size 2).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.real_te import stand_ins

stand_ins.install()

import torch  # noqa: E402  (after the TE stand-in: megatron-core imports TE at import)
import torch.distributed as dist  # noqa: E402

from nemo_rl_attn_align.kernels import te_selector  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NVTE_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_ALLOW_NONDETERMINISTIC_ALGO")
KERNELS = {
    "flash_attention": "FlashAttention",
    "fused_attention": "FusedAttention",
    "unfused_attention": "UnfusedDotProductAttention",
}


@dataclass(frozen=True)
class Case:
    """One recipe's attention as Megatron hands it to TE, and the GPU it runs on."""

    gpu: tuple[int, int] = (9, 0)
    backend: str = "flash"  # policy.megatron_cfg.attention_backend
    dtype: str = "bf16"  # policy.precision
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    window: int | None = None  # left sliding window (megatron window_size = (window, 0))
    softmax: str = "vanilla"  # TransformerConfig.softmax_type
    cp: int = 1  # context_parallel_size
    qkv_format: str = "sbhd"  # thd: NeMo-RL's sequence packing
    deterministic: bool = False  # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
    flash_attn: str | None = "2.8.3"
    flash_attn_3: str | None = None
    seq_len: int = 256  # tokens in each sequence
    batch: int = 2  # sequences (packed one after the other with thd)


@dataclass
class Outcome:
    """What TE did: the kernel its forward dispatched to (None: it raised), its selection, the error."""

    kernel: str | None
    selection: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class _KernelStandIn(torch.nn.Module):
    """Stands for one of TE's attention kernels: records the call, returns zeros of the output's shape."""

    def __init__(self, name: str, calls: list[str]):
        super().__init__()
        self.kernel_name, self.calls = name, calls

    def forward(self, *args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 3]
        q, v = tensors[0], tensors[2]
        self.calls.append(self.kernel_name)
        return torch.zeros(*q.shape[:-2], q.shape[-2] * v.shape[-1], dtype=q.dtype)


_world: dict[str, Any] = {}


def _parallel_state(cp: int) -> None:
    from megatron.core import parallel_state

    if not dist.is_initialized():
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    if _world.get("cp") != cp:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(context_parallel_size=cp, create_gloo_process_groups=False)
        _world["cp"] = cp


@contextlib.contextmanager
def _environment(case: Case) -> Iterator[None]:
    """NVTE variables as Megatron's ``_set_attention_backend`` sets them, and the determinism switch."""
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.transformer.enums import AttnBackend

    with te_selector.environment({}, NVTE_ENV):  # none set before, all restored after
        holder = type("ModelConfigHolder", (), {})()
        holder.config = type("Config", (), {"attention_backend": AttnBackend[case.backend]})()
        LanguageModule._set_attention_backend(holder)
        os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "0" if case.deterministic else "1"
        yield


def transformer_config(case: Case):
    """The ``TransformerConfig`` NeMo-RL would build for ``case`` (one layer; the attention fields)."""
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    dtype = DTYPES[case.dtype]
    return TransformerConfig(
        num_layers=1,
        hidden_size=case.heads * case.head_dim,
        num_attention_heads=case.heads,
        num_query_groups=case.kv_heads,
        kv_channels=case.head_dim,
        params_dtype=dtype,
        bf16=dtype is torch.bfloat16,
        fp16=dtype is torch.float16,
        attention_backend=AttnBackend[case.backend],
        context_parallel_size=case.cp,
        window_size=(case.window, 0) if case.window is not None else None,
        softmax_type=case.softmax,
        attention_dropout=0.0,  # Megatron-Bridge copies the HF config's (0.0 for the models NeMo-RL trains)
        deterministic_mode=False,
    )


def build_core_attention(case: Case):
    """megatron-core's TE core attention, built as ``Attention.__init__`` builds it from the TE spec."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.enums import AttnMaskType

    config = transformer_config(case)
    spec = get_gpt_layer_with_transformer_engine_spec()
    core_attention = spec.submodules.self_attention.submodules.core_attention
    return core_attention(
        config=config,
        layer_number=1,
        attn_mask_type=AttnMaskType.causal,
        attention_type="self",
        cp_comm_type="p2p",
        softmax_scale=config.softmax_scale,
        pg_collection=None,
    )


def _inputs(case: Case) -> tuple[tuple, dict]:
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    dtype, local = DTYPES[case.dtype], case.seq_len // case.cp
    if case.qkv_format == "thd":
        tokens = local * case.batch
        shape_q, shape_kv = (tokens, case.heads, case.head_dim), (tokens, case.kv_heads, case.head_dim)
        cu_seqlens = torch.arange(case.batch + 1, dtype=torch.int32) * case.seq_len
        packed = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            cu_seqlens_q_padded=cu_seqlens,
            cu_seqlens_kv_padded=cu_seqlens,
            max_seqlen_q=case.seq_len,
            max_seqlen_kv=case.seq_len,
        )
        extra = {"packed_seq_params": packed}
    else:
        shape_q = (local, case.batch, case.heads, case.head_dim)
        shape_kv = (local, case.batch, case.kv_heads, case.head_dim)
        extra = {}
    q = torch.zeros(shape_q, dtype=dtype)
    k, v = torch.zeros(shape_kv, dtype=dtype), torch.zeros(shape_kv, dtype=dtype)
    return (q, k, v, None, AttnMaskType.causal), extra


def te_reasons(attention_params) -> list[str]:
    """TE's own "Disabling ..." lines for ``attention_params`` (its selector rerun at debug level; the oracle)."""
    from transformer_engine.pytorch.attention.dot_product_attention import utils

    lines: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger, saved = logging.getLogger("DotProductAttention"), utils.AttentionLogging._log_level
    stream = utils.AttentionLogging._stream_handler
    stream_level = stream.level
    logger.addHandler(handler)
    stream.setLevel(max(saved, stream_level))
    utils.AttentionLogging._log_level = logging.DEBUG
    try:
        utils.get_attention_backend(attention_params)
    finally:
        utils.AttentionLogging._log_level = saved
        logger.setLevel(saved)
        logger.removeHandler(handler)
        stream.setLevel(stream_level)
    return [line for line in lines if line.startswith("Disabling")]


def run(case: Case) -> tuple[Outcome, Any]:
    """Build and run ``case``; (what TE did, the module, for ``te_readback.observe``)."""
    from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention as dpa

    _parallel_state(case.cp)
    with (
        stand_ins.declared_device(case.gpu, flash_attn=case.flash_attn, flash_attn_3=case.flash_attn_3),
        _environment(case),
    ):
        module = build_core_attention(case)
        calls: list[str] = []
        for name, label in KERNELS.items():
            setattr(module, name, _KernelStandIn(label, calls))
        dpa._attention_backends["attention_params"] = None  # a fresh selection, as in a new process
        args, kwargs = _inputs(case)
        error = None
        try:
            module(*args, **kwargs)
        except ValueError as err:
            error = str(err)
        state = dict(dpa._attention_backends)
        reasons = te_reasons(state["attention_params"]) if state["attention_params"] is not None else []
    selection = {
        "use_flash_attention": bool(state["use_flash_attention"]),
        "flash_attention_backend": str(state["flash_attention_backend"]) if state["use_flash_attention"] else None,
        "use_fused_attention": bool(state["use_fused_attention"]),
        "fused_attention_backend": state["fused_attention_backend"],
        "use_unfused_attention": bool(state["use_unfused_attention"]),
        "reasons": reasons,
    }
    return Outcome(calls[0] if calls else None, selection, error), module
