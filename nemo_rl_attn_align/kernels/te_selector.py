"""Transformer Engine's own backend selection, run in this process for one ``TrainingQuery``.

``select(query)`` builds TE's ``AttentionParams`` as ``DotProductAttention.forward`` gathers them
for the tensors megatron-core's ``TEDotProductAttention`` passes it (``sbhd`` q/k/v, or ``thd``
with NeMo-RL's packed boundaries; causal, no bias, no dropout, training), sets the NVTE variables
Megatron sets for the backend, and calls TE's real ``get_attention_backend`` on the GPU this process
sees. The answer carries TE's own "Disabling ..." reasons. ``tests/real_te`` proves, on a declared
device, that this gives what TE's forward selects for the same model. Imports torch and TE.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields

from nemo_rl_attn_align.kernels.kernel_query import PRECISION_OF_DTYPE, Kernel, TrainingQuery
from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND

UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
_SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_FLASH_ATTN_V2", "NVTE_FLASH_ATTN_V3",
             "NVTE_FLASH_ATTN_V4")  # fmt: skip


def unavailable() -> str | None:
    """Why TE's selector cannot run in this process (None: it can)."""
    try:
        import importlib

        importlib.import_module(UTILS_MODULE)
    except Exception as err:  # TE raises RuntimeError, OSError, ... when its libraries are missing
        return f"Transformer Engine does not load here ({type(err).__name__}: {err})"
    return None


@contextlib.contextmanager
def environment(wanted: Mapping[str, str], names: Iterable[str]) -> Iterator[None]:
    """For the block, each of ``names`` set as in ``wanted`` (unset when it is not there); restored after."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        for name in saved:
            if name in wanted:
                os.environ[name] = wanted[name]
            else:
                os.environ.pop(name, None)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def attention_params(query: TrainingQuery):
    """TE's ``AttentionParams`` for ``query`` (fields the installed TE lacks are left out)."""
    import importlib

    import torch

    utils = importlib.import_module(UTILS_MODULE)
    thd = query.qkv_format == "thd"
    window = (query.window, 0) if query.window is not None else (-1, 0)
    tokens = query.seq_len * query.batch_size // query.cp_size if thd else 0
    values = {
        "qkv_type": torch.Tensor,
        "qkv_dtype": getattr(torch, PRECISION_OF_DTYPE[query.dtype]),
        "qkv_layout": "thd_thd_thd" if thd else "sbhd_sbhd_sbhd",
        "batch_size": query.batch_size,
        "num_heads": query.heads,
        "num_gqa_groups": query.kv_heads,
        "max_seqlen_q": query.seq_len,
        "max_seqlen_kv": query.seq_len,
        "num_tokens_q": tokens,
        "num_tokens_kv": tokens,
        "head_dim_qk": query.head_dim_qk,
        "head_dim_v": query.head_dim_v,
        "attn_mask_type": "padding_causal" if thd else "causal",
        "window_size": window,
        "bottom_right_diagonal": False,
        "softcap": 0.0,
        "alibi_slopes_shape": None,
        "core_attention_bias_type": "no_bias",
        "core_attention_bias_shape": None,
        "core_attention_bias_requires_grad": False,
        "pad_between_seqs": False,
        "attention_dropout": 0.0,
        "context_parallel": query.cp_size > 1,
        "cp_comm_type": "p2p",
        "cp_size": query.cp_size,
        "deterministic": query.deterministic,
        "is_training": True,
        "fp8": False,
        "fp8_meta": {"fp8_checkpoint": False, "fp8_group": None},
        "inference_params": None,
        "softmax_type": query.softmax,
        "return_max_logit": False,
        "cuda_graph": False,
        "num_splits": 1,
        "softmax_scale": 1.0 / math.sqrt(query.head_dim_qk),
    }
    known = {f.name for f in fields(utils.AttentionParams)}
    return utils.AttentionParams(**{k: v for k, v in values.items() if k in known})


def _kernel(result, reasons: list[str], source: str) -> Kernel:
    use_flash, flash_version, use_fused, fused_sub, use_unfused = tuple(result)[:5]
    if use_flash:
        return Kernel("training", "FlashAttention", str(flash_version), tuple(reasons), source)
    if use_fused:
        return Kernel("training", "FusedAttention", f"sub-backend {int(fused_sub)}", tuple(reasons), source)
    if use_unfused:
        return Kernel("training", "UnfusedDotProductAttention", None, tuple(reasons), source)
    return Kernel("training", None, None, tuple(reasons), source)


def select(query: TrainingQuery) -> Kernel:
    """TE's choice for ``query`` on this process's GPU, with TE's reasons."""
    import importlib

    import transformer_engine

    from nemo_rl_attn_align.hosts.te_readback import call_collecting_reasons
    from nemo_rl_attn_align.vocab import patching as _patching

    utils = importlib.import_module(UTILS_MODULE)
    selector = _patching.original_of(utils.get_attention_backend)
    source = f"Transformer Engine {getattr(transformer_engine, '__version__', '?')} get_attention_backend, run here"
    wanted = {**NVTE_BY_BACKEND[query.backend], **dict(query.flash_switches)}  # as the Megatron worker has them
    with environment(wanted, _SWITCHES):
        result, reasons = call_collecting_reasons(selector, (attention_params(query),), {})
    return _kernel(result, reasons, source)
