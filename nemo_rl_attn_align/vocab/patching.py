"""Reversible, idempotent function wrapping shared by the host modules (stdlib only).

A wrapper is known by identity: a registry keyed on the wrapper object holds what it wrapped and
what the owner's own ``__dict__`` held before (nothing, for an inherited method), so no marker
attribute exists for ``functools.wraps`` to copy onto someone else's wrapper of ours. Wrapping twice
is a no-op; ``unwrap`` restores exactly what was there, and when another layer was put on top of
ours it leaves that layer in place and turns ours into a pass-through to the original. Hosts patch
module attributes (functions called through a module global, or names another module imported by
name) and methods on classes. A class attribute is looked up through ``vars()`` along the MRO, as
wrapt's ``resolve_path`` does, so a ``classmethod`` or ``staticmethod`` is wrapped as the function it
holds and goes back in as the same kind of descriptor (calls bind as before). ``hooks.Hook`` wraps
a host's declared seams with it.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nemo_rl_attn_align")

_ABSENT = object()  # the owner's own __dict__ had no such name (an inherited method)


class StrictModeError(RuntimeError):
    """Something strict mode does not let pass (``bootstrap`` lets it through to stop the run)."""

    stops_run = True


class HostLayoutError(StrictModeError):
    """A host whose layout the plugin does not recognise, in strict mode."""


class _Layer:
    """One wrapper of ours: where it sits, what it wrapped, what the owner's own ``__dict__`` held
    before, and what it calls (``hooked`` while active, ``original`` once a pass-through)."""

    def __init__(self, owner: Any, name: str, original: Callable, hooked: Callable):
        self.owner, self.name, self.original, self.hooked = owner, name, original, hooked
        self.previous = getattr(owner, "__dict__", {}).get(name, _ABSENT)
        self.call = hooked
        self.ref: Callable[[], Any] = lambda: None  # the wrapper, weakly, once made

    @property
    def active(self) -> bool:
        return self.call is self.hooked

    def sits_at(self, owner: Any, name: str) -> bool:
        return self.owner is owner and self.name == name


#: id(wrapper) -> its layer; the layer's weak reference to the wrapper drops the entry with it
#: (single dict operations and snapshots only: that callback may run inside any of them, at GC).
_layers: dict[int, _Layer] = {}
_MAX_CHAIN = 100  # __wrapped__ links followed (a cycle of them must not hang an attach)


def _layer_of(func: Any) -> _Layer | None:
    """The layer whose wrapper is ``func`` itself (identity), else None."""
    layer = _layers.get(id(func))
    return layer if layer is not None and layer.ref() is func else None


def _layers_in(func: Any) -> list[_Layer]:
    """Our layers at ``func`` and down its ``__wrapped__`` chain (``functools.wraps`` sets it)."""
    found = []
    for _ in range(_MAX_CHAIN):
        if func is None:
            break
        layer = _layer_of(func)
        if layer is not None:
            found.append(layer)
        func = getattr(func, "__wrapped__", None)
    return found


def _function_of(entry: Any) -> Any:
    """The function a classmethod or staticmethod holds, else ``entry`` itself."""
    return entry.__func__ if isinstance(entry, (classmethod, staticmethod)) else entry


def _resolve(owner: Any, name: str) -> tuple[Any, type | None]:
    """What ``owner.name`` holds, unbound, and its descriptor kind. For a class: the entry of the
    first class along the MRO whose ``vars()`` has ``name`` (``getattr`` would bind a classmethod to
    ``owner`` and strip a staticmethod), a classmethod or staticmethod replaced by its function.
    Otherwise (modules, instances) ``getattr``. ``(None, None)`` when there is no such attribute."""
    if isinstance(owner, type):
        for cls in owner.__mro__:
            entry = vars(cls).get(name, _ABSENT)
            if entry is not _ABSENT:
                kind = type(entry) if isinstance(entry, (classmethod, staticmethod)) else None
                return _function_of(entry), kind
    return getattr(owner, name, None), None


def _site_layers(owner: Any, name: str) -> list[_Layer]:
    """Our layers for ``owner.name``: those reachable from what it holds now first, then any other
    (one under a foreign wrapper that did not set ``__wrapped__``)."""
    reachable = [layer for layer in _layers_in(_resolve(owner, name)[0]) if layer.sits_at(owner, name)]
    others = [layer for layer in list(_layers.values()) if layer.sits_at(owner, name) and layer not in reachable]
    return reachable + others


def is_wrapped(func: Any) -> bool:
    """True when ``func`` is an active wrapper of ours, or wraps one (a layer stacked on ours)."""
    return any(layer.active for layer in _layers_in(func))


def original_of(func: Any) -> Any:
    """What our outermost layer at or under ``func`` wrapped (the host's own function), else ``func``."""
    layers = _layers_in(func)
    return layers[0].original if layers else func


def _forget(key: int, layer: _Layer, _ref: Any = None, layers: dict[int, _Layer] = _layers) -> None:
    # Also the weak reference's callback (``_ref``), which may run at interpreter exit after this
    # module's globals are gone: ``layers`` is bound at definition.
    if layers.get(key) is layer:
        layers.pop(key, None)


def _new_wrapper(owner: Any, name: str, original: Callable, make_wrapper: Callable[[Callable], Callable]) -> Callable:
    layer = _Layer(owner, name, original, make_wrapper(original))

    def wrapper(*args, **kwargs):
        return layer.call(*args, **kwargs)

    functools.wraps(original)(wrapper)
    key = id(wrapper)
    layer.ref = weakref.ref(wrapper, functools.partial(_forget, key, layer))
    _layers[key] = layer
    return wrapper


def wrap(owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.name`` by a wrapper calling ``make_wrapper(original)``; False when missing or
    already wrapped. Our pass-through layer under someone else's (see ``unwrap``) is switched back on.
    A classmethod or staticmethod: ``make_wrapper`` gets its function (a classmethod's takes ``cls``
    first) and the wrapper goes in as the same kind of descriptor."""
    original, kind = _resolve(owner, name)
    if original is None:
        return False
    reachable = [layer for layer in _layers_in(original) if layer.sits_at(owner, name)]
    if reachable:
        if reachable[0].active:
            return False
        reachable[0].call = reachable[0].hooked
        return True
    if is_wrapped(original):  # ours for another site (a name imported from a wrapped module)
        return False
    wrapper = _new_wrapper(owner, name, original, make_wrapper)
    setattr(owner, name, kind(wrapper) if kind else wrapper)
    return True


def unwrap(owner: Any, name: str) -> bool:
    """Undo ``wrap``: the owner's own attribute is what it was (deleted again for an inherited
    method). When something else sits at ``owner.name`` now (a layer stacked on ours), it stays
    and ours becomes a pass-through to the original. False when no active layer of ours is there."""
    layer = next((layer for layer in _site_layers(owner, name) if layer.active), None)
    if layer is None:
        return False
    wrapper = layer.ref()
    if wrapper is not None and _function_of(getattr(owner, "__dict__", {}).get(name)) is wrapper:
        if layer.previous is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, layer.previous)
        _forget(id(wrapper), layer)
    else:
        layer.call = layer.original
    return True


def guarded(
    step: str,
    action: Callable[[], Any],
    strict: bool,
    stops: tuple[type[Exception], ...] = (),
    on_failure: Callable[[str], Any] | None = None,
) -> Any:
    """Run one step of the plugin's own work inside a host process: its failure is one warning and
    the run goes on (``on_failure`` gets the warning's text, to keep it as a finding; its own
    failure is ignored), unless ``strict``, the exception carries ``stops_run``, or it is one of
    ``stops`` (the plugin's own stops, e.g. a config that cannot work): then it propagates."""
    try:
        return action()
    except Exception as exc:
        if strict or getattr(exc, "stops_run", False) or isinstance(exc, stops):
            raise
        problem = f"{step} failed ({type(exc).__name__}: {exc})"
        log.warning("nemo-rl-attn-align: %s; the run goes on unrecorded", problem)
        if on_failure is not None:
            try:
                on_failure(problem)
            except Exception:  # the finding cannot be kept: the warning stands
                pass
        return None
