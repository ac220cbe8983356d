"""What attention a Megatron model really ran: read back after its first forward.

Sources, best first:

1. The core-attention module classes: Megatron's own ``DotProductAttention`` (``local``, the local
   layer spec) runs no TE at all, whatever the NVTE variables say.
2. Transformer Engine's module global ``_attention_backends`` in
   ``transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py`` (TE >= 2.4,
   refactor #1704): ``DotProductAttention.forward`` stores the latest selection there.
3. Every selection ``dpa_utils.get_attention_backend`` returned in this process: ``forward`` calls
   it through the module attribute, so wrapping ``utils.get_attention_backend`` sees each one.

The wrapper also keeps TE's own reasons: the "Disabling ..." lines ``get_attention_backend`` logs at
debug level (shown by TE only under ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``). They are captured for that
call alone, and TE's own log output stays what the user's ``NVTE_DEBUG`` asks for. A selection
with no backend at all (TE then raises "No dot product attention backend is available") reads back
as ``no_backend`` with those reasons. Where no source answers, the result says ``unobservable``,
never that the request was applied.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.hosts.seams import HOOKS, Seam
from nemo_rl_attn_align.kernels.kernel_query import substantive
from nemo_rl_attn_align.kernels.te_selector import call_collecting_reasons
from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND
from nemo_rl_attn_align.vocab import patching as _patching

UTILS_MODULE = HOOKS["te_readback"].seams[0].module  # where get_attention_backend is
DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"

LOCAL_ATTENTION_CLASS = ("megatron.core.transformer.dot_product_attention", "DotProductAttention")

#: Distinct selections ``get_attention_backend`` returned in this process, in order.
selections: list[dict[str, Any]] = []


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


def _record_selection(result: Any, reasons: list[str]) -> None:
    try:
        selection = {**selection_from_flags(*tuple(result)[:5]), "reasons": list(reasons)}
    except (TypeError, ValueError):
        return
    if not selections or selections[-1] != selection:
        selections.append(selection)


def _recording(original: Callable, seam: Seam) -> Callable:
    def get_attention_backend(*args, **kwargs):
        result, reasons = call_collecting_reasons(original, args, kwargs)
        _record_selection(result, reasons)
        return result

    return get_attention_backend


_seams = hooks.Hook("te_readback")
#: Record TE's backend selections from now on (when TE's utils module is imported); stop, restore.
attach, detach = _seams.attach, _seams.detach


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
        selection = selection_from_flags(*flags)
        wrapped = selections[-1] if selections else {}
        same = {k: v for k, v in wrapped.items() if k != "reasons"} == selection
        return {**selection, "reasons": wrapped.get("reasons", []) if same else []}, f"{DPA_MODULE}._attention_backends"
    if selections:
        return selections[-1], f"{UTILS_MODULE}.get_attention_backend (wrapped)"
    return None, "TE made no backend selection visible (no _attention_backends, no get_attention_backend call)"


def observe(modules: Iterable[Any]) -> dict[str, Any]:
    """What the attention modules among ``modules`` (e.g. a model's ``modules()``) really ran: ``status``
    ``observed`` (with ``backend``, ``detail``, TE's ``reasons``), ``no_backend`` (TE found none, and
    why) or ``unobservable``."""
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
        if selection is None:
            return {"status": "unobservable", "backend": None, "engine": "megatron-te", "source": source}
        status = "observed" if selection["backend"] is not None else "no_backend"
        return {"status": status, "engine": "megatron-te", "source": source, **selection}
    return {
        "status": "unobservable",
        "backend": None,
        "engine": None,
        "source": "no Megatron or TE core-attention module in the model",
    }


def mismatch(effective: str | None, observed: Mapping[str, Any]) -> str | None:
    """Why the observed backend differs from the requested AttnBackend ``effective`` (or why TE found
    none), with TE's own reasons; None when it agrees."""
    reasons = "; ".join(substantive(observed.get("reasons") or ()))
    because = f"; Transformer Engine: {reasons}" if reasons else ""
    if observed.get("status") == "no_backend":
        return f"Transformer Engine found no attention backend for AttnBackend.{effective}{because}"
    if observed.get("status") != "observed" or effective in (None, "auto"):
        return None
    wanted = TE_CLASS_BY_BACKEND.get(effective)
    if observed.get("backend") == wanted:
        return None
    return (
        f"attention_backend requested AttnBackend.{effective} ({wanted}) but the model ran "
        f"{observed.get('backend')} ({observed.get('source')}){because}"
    )


def watch_first_forward(
    model: Any, callback: Callable[[dict[str, Any]], None], strict: bool = False
) -> Callable[[], None]:
    """Call ``callback(observe(...))`` once, right after the first forward of ``model``, also when
    that forward raises (TE's "No dot product attention backend is available": the read-back then
    says ``no_backend`` and why, and the forward's own exception goes on unchanged).

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

    try:
        handle = chunks[0].register_forward_hook(after_forward, always_call=True)
    except TypeError:  # torch before 2.1 has no always_call
        handle = chunks[0].register_forward_hook(after_forward)
    return handle.remove
