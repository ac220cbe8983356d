"""Transformer Engine's own backend selection, run in this process for one ``TrainingQuery``.

``select(query)`` builds TE's ``AttentionParams`` as ``DotProductAttention.forward`` gathers them
for the tensors megatron-core's ``TEDotProductAttention`` passes it (``sbhd`` q/k/v, or ``thd``
with NeMo-RL's packed boundaries; causal, no bias, no dropout, training), sets the NVTE variables
Megatron sets for the backend, and calls TE's real ``get_attention_backend`` on the GPU this process
sees. The answer carries TE's own "Disabling ..." reasons. ``tests/real_te`` proves, on a declared
device, that this gives what TE's forward selects for the same model. Imports torch and TE.
``call_collecting_reasons`` (one call's reasons, TE's own log output untouched) is shared with the
Megatron worker's read-back (``hosts.te_readback``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any

from nemo_rl_attn_align.kernels.kernel_query import PRECISION_OF_DTYPE, Kernel, TrainingQuery
from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND

UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
_SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_FLASH_ATTN_V2", "NVTE_FLASH_ATTN_V3",
             "NVTE_FLASH_ATTN_V4")  # fmt: skip
TE_LOGGER = "DotProductAttention"
#: Most of TE's reasons a selection keeps (TE logs one line per backend it disables).
MAX_REASONS = 12


class _ReasonCollector(logging.Handler):
    """Keeps the "Disabling ..." lines of one ``get_attention_backend`` call."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed TE record is not ours to fail on
            return
        if message.startswith("Disabling") and message not in self.reasons and len(self.reasons) < MAX_REASONS:
            self.reasons.append(message)


def call_collecting_reasons(original: Callable, args: tuple, kwargs: dict) -> tuple[Any, list[str]]:
    """``original(*args, **kwargs)`` with TE's debug reasons collected; TE's own handler, and the
    logger's level afterwards, stay as the user's ``NVTE_DEBUG`` set them."""
    attn_log: Any = getattr(sys.modules.get(UTILS_MODULE), "AttentionLogging", None)
    stream = getattr(attn_log, "_stream_handler", None)
    level = getattr(attn_log, "_log_level", None)
    if not isinstance(level, int) or not isinstance(stream, logging.Handler):
        return original(*args, **kwargs), []
    logger = logging.getLogger(TE_LOGGER)
    if not logger.hasHandlers():  # what get_attention_backend does on its first call
        logger.addHandler(stream)
    collector, stream_level = _ReasonCollector(), stream.level
    stream.setLevel(max(stream_level, level))
    logger.addHandler(collector)
    attn_log._log_level = logging.DEBUG
    try:
        return original(*args, **kwargs), collector.reasons
    finally:
        attn_log._log_level = level
        logger.setLevel(level)
        logger.removeHandler(collector)
        stream.setLevel(stream_level)


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

    from nemo_rl_attn_align.vocab import patching as _patching

    utils = importlib.import_module(UTILS_MODULE)
    selector = _patching.original_of(utils.get_attention_backend)
    source = f"Transformer Engine {getattr(transformer_engine, '__version__', '?')} get_attention_backend, run here"
    wanted = {**NVTE_BY_BACKEND[query.backend], **dict(query.flash_switches)}  # as the Megatron worker has them
    with environment(wanted, _SWITCHES):
        result, reasons = call_collecting_reasons(selector, (attention_params(query),), {})
    return _kernel(result, reasons, source)
