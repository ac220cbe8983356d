"""What attention a Megatron model really ran: read back after its first forward.

Sources, best first:

1. The core-attention module classes: Megatron's own ``DotProductAttention`` (``local``, the local
   layer spec) runs no TE at all, whatever the NVTE variables say.
2. Transformer Engine's module global ``_attention_backends`` in
   ``transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py`` (TE >= 2.4,
   refactor #1704): ``DotProductAttention.forward`` stores the latest selection there.
3. Every selection ``dpa_utils.get_attention_backend`` returned in this process: ``forward`` calls
   it through the module attribute, so wrapping ``utils.get_attention_backend`` sees each one.
4. The ``DotProductAttention`` logger's "Selected backend = ..." / "Running with ... backend" lines,
   which TE emits only under ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL>=1``.

Where none of them answers, the result says ``unobservable``, never that the request was applied.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nemo_rl_attn_align.hosts import _patching
from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND

UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
TARGETS = (UTILS_MODULE,)

LOCAL_ATTENTION_CLASS = ("megatron.core.transformer.dot_product_attention", "DotProductAttention")
TE_LOGGER = "DotProductAttention"

#: Distinct selections ``get_attention_backend`` returned in this process, in order.
selections: list[dict[str, Any]] = []

_LOG_PATTERN = re.compile(
    r"(?:Selected backend = |Running with )(FlashAttention|FusedAttention|UnfusedDotProductAttention)"
)


def selection_from_flags(
    use_flash: Any, flash_version: Any, use_fused: Any, fused_sub: Any, use_unfused: Any
) -> dict[str, Any]:
    """Name the backend TE runs for one selection, in ``DotProductAttention.forward``'s order."""
    if use_flash:
        major = getattr(flash_version, "major", None)
        return {"backend": "FlashAttention", "flash_attention_version": major, "detail": f"flash-attn {flash_version}"}
    if use_fused:
        return {
            "backend": "FusedAttention",
            "detail": f"sub-backend {int(fused_sub) if fused_sub is not None else '?'}",
        }
    if use_unfused:
        return {"backend": "UnfusedDotProductAttention", "detail": ""}
    return {"backend": None, "detail": "no backend available"}


def _record_selection(result: Any) -> None:
    try:
        selection = selection_from_flags(*tuple(result)[:5])
    except (TypeError, ValueError):
        return
    if not selections or selections[-1] != selection:
        selections.append(selection)


def _recording(original: Callable) -> Callable:
    def get_attention_backend(*args, **kwargs):
        result = original(*args, **kwargs)
        _record_selection(result)
        return result

    return get_attention_backend


class _SelectionLogHandler(logging.Handler):
    """Keeps the backend names TE's debug log announces."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = _LOG_PATTERN.search(record.getMessage())
        if match:
            self.seen.append(match.group(1))


log_handler = _SelectionLogHandler()


def _patch(utils) -> None:
    from nemo_rl_attn_align.hosts import handoff, versions

    versions.check_supported("Transformer Engine", handoff.worker_settings().strict)  # once per process
    if not _seams.wrap(utils, "get_attention_backend", _recording) and not _patching.is_wrapped(
        getattr(utils, "get_attention_backend", None)
    ):
        _patching.unsupported(
            "Transformer Engine",
            _patching.distribution_version("transformer-engine"),
            f"{UTILS_MODULE} has no get_attention_backend",
            handoff.worker_settings().strict,
        )
    logger = logging.getLogger(TE_LOGGER)
    if log_handler not in logger.handlers:
        logger.addHandler(log_handler)


_seams = _patching.Seams(TARGETS, _patch)


def attach() -> None:
    """Record TE's backend selections from now on (when TE's utils module is imported)."""
    _seams.attach()


def detach() -> None:
    """Stop recording and restore ``get_attention_backend``."""
    _seams.detach()
    logging.getLogger(TE_LOGGER).removeHandler(log_handler)


def _attention_module_kinds(modules: Iterable[Any]) -> tuple[set[str], set[str]]:
    """(local core-attention class paths, TE core-attention class paths) among ``modules``."""
    local, te = set(), set()
    for module in modules:
        for cls in type(module).__mro__:
            where = (cls.__module__, cls.__name__)
            if where == LOCAL_ATTENTION_CLASS:
                local.add(f"{type(module).__module__}.{type(module).__name__}")
                break
            if cls.__module__.startswith("transformer_engine.") and cls.__name__ == "DotProductAttention":
                te.add(f"{type(module).__module__}.{type(module).__name__}")
                break
    return local, te


def _te_selection() -> tuple[dict[str, Any] | None, str]:
    dpa = sys.modules.get(DPA_MODULE)
    state = getattr(dpa, "_attention_backends", None)
    if isinstance(state, Mapping) and state.get("attention_params") is not None:
        flags = [
            state.get(k)
            for k in (
                "use_flash_attention",
                "flash_attention_backend",
                "use_fused_attention",
                "fused_attention_backend",
                "use_unfused_attention",
            )
        ]
        return selection_from_flags(*flags), f"{DPA_MODULE}._attention_backends"
    if selections:
        return selections[-1], f"{UTILS_MODULE}.get_attention_backend (wrapped)"
    if log_handler.seen:
        return {"backend": log_handler.seen[-1], "detail": ""}, "TE DotProductAttention debug log (NVTE_DEBUG)"
    return (
        None,
        "TE made no backend selection visible (no _attention_backends, no get_attention_backend call, no NVTE_DEBUG "
        "log)",
    )


def observe(modules: Iterable[Any]) -> dict[str, Any]:
    """What the attention modules among ``modules`` (e.g. ``model.modules()``) really ran."""
    local, te = _attention_module_kinds(modules)
    if local and not te:
        return {
            "status": "observed",
            "backend": "local",
            "engine": "megatron-local",
            "source": f"core_attention is {sorted(local)[0]}",
        }
    if te:
        selection, source = _te_selection()
        if selection is None or selection["backend"] is None:
            return {"status": "unobservable", "backend": None, "engine": "megatron-te", "source": source}
        return {"status": "observed", "engine": "megatron-te", "source": source, **selection}
    return {
        "status": "unobservable",
        "backend": None,
        "engine": None,
        "source": "no Megatron or TE core-attention module in the model",
    }


def mismatch(effective: str | None, observed: Mapping[str, Any]) -> str | None:
    """Why the observed backend differs from the requested AttnBackend ``effective``; None when it agrees."""
    if observed.get("status") != "observed" or effective in (None, "auto"):
        return None
    wanted = TE_CLASS_BY_BACKEND.get(effective)
    if observed.get("backend") == wanted:
        return None
    return (
        f"attention_backend requested AttnBackend.{effective} ({wanted}) but the model ran "
        f"{observed.get('backend')} ({observed.get('source')})"
    )


def watch_first_forward(
    model: Any, callback: Callable[[dict[str, Any]], None], strict: bool = False
) -> Callable[[], None]:
    """Call ``callback(observe(...))`` once, right after the first forward of ``model``.

    ``model`` is a torch module or a list of model chunks (the hook goes on the first). The hook
    runs inside the user's forward: a failure of ``observe`` or ``callback`` is one warning and the
    forward returns as usual, unless ``strict`` (or the error carries ``stops_run``). Returns a
    function that removes the hook if it has not fired yet.
    """
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    handle: Any = None  # the forward hook's handle, set below

    def after_forward(module, inputs, output):
        handle.remove()
        _patching.guarded(
            "reading back the attention backend",
            lambda: callback(observe(m for chunk in chunks for m in chunk.modules())),
            strict,
        )

    handle = chunks[0].register_forward_hook(after_forward)
    return handle.remove
