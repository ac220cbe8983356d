"""Reversible, idempotent function wrapping shared by the host modules (stdlib only).

A wrapper keeps the original under ``ORIGINAL_ATTR``: wrapping twice is a no-op and ``unwrap``
restores exactly what was there. Hosts patch module attributes (functions called through a module
global, or names another module imported by name) and methods on classes. ``Seams`` is one host's
``attach()`` / ``detach()``: the modules it watches and everything it wrapped in them.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Iterable

from nemo_rl_attn_align.hosts import bootstrap

ORIGINAL_ATTR = "__nemo_rl_attn_align_original__"

log = logging.getLogger("nemo_rl_attn_align")


class StrictModeError(RuntimeError):
    """Something strict mode does not let pass (``bootstrap`` lets it through to stop the run)."""

    stops_run = True


class HostLayoutError(StrictModeError):
    """A host whose layout the plugin does not recognise, in strict mode."""


def is_wrapped(func: Any) -> bool:
    """True when ``func`` is one of our wrappers."""
    return getattr(func, ORIGINAL_ATTR, None) is not None


def wrap(owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.name`` by ``make_wrapper(original)``; False when missing or already wrapped."""
    original = getattr(owner, name, None)
    if original is None or is_wrapped(original):
        return False
    wrapper = functools.wraps(original)(make_wrapper(original))
    setattr(wrapper, ORIGINAL_ATTR, original)
    setattr(owner, name, wrapper)
    return True


def unwrap(owner: Any, name: str) -> bool:
    """Put back what ``wrap`` replaced; False when ``owner.name`` is not our wrapper."""
    current = getattr(owner, name, None)
    original = getattr(current, ORIGINAL_ATTR, None)
    if original is None:
        return False
    setattr(owner, name, original)
    return True


class Seams:
    """The modules one host patches (``targets``), its ``patch(module)`` callback, and what it wrapped."""

    def __init__(self, targets: Iterable[str], patch: Callable[[Any], None]):
        self.targets = tuple(targets)
        self.patch = patch
        self._wrapped: list[tuple[Any, str]] = []

    def attach(self) -> None:
        """Patch each target now if imported, else right after its import (idempotent)."""
        for name in self.targets:
            bootstrap.watch(name, self.patch)

    def detach(self) -> None:
        """Stop watching and put back everything ``wrap`` replaced."""
        for name in self.targets:
            bootstrap.unwatch(name, self.patch)
        while self._wrapped:
            unwrap(*self._wrapped.pop())

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
        """``wrap`` and remember it for ``detach``."""
        done = wrap(owner, name, make_wrapper)
        if done:
            self._wrapped.append((owner, name))
        return done


def guarded(step: str, action: Callable[[], Any], strict: bool) -> Any:
    """Run one step of the plugin's own observability: its failure is one warning (the run goes on)
    unless ``strict`` or the exception carries ``stops_run`` (then it propagates)."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001
        if strict or getattr(exc, "stops_run", False):
            raise
        log.warning("nemo-rl-attn-align: %s failed (%s: %s); the run goes on unrecorded", step, type(exc).__name__, exc)
        return None


_warned: set[str] = set()


def unsupported(host: str, version: str | None, missing: str, strict: bool) -> None:
    """One clear warning (once per host and seam) for a layout we do not recognise; an error if strict."""
    message = f"{host} {version or '(version unknown)'}: {missing}."
    if strict:
        raise HostLayoutError(
            f"{message} attention_align.strict is true, so the run stops here. "
            "Fix: use a supported version, or set attention_align.strict: false to run unrecorded."
        )
    key = f"{host}:{missing}"
    if key not in _warned:
        _warned.add(key)
        log.warning("nemo-rl-attn-align: %s The plugin leaves it untouched and records nothing for it.", message)


def host_version(module: str, distribution: str) -> str | None:
    """Version of a host library: ``<module>.__version__`` if imported (NeMo-RL is not on PyPI),
    else the installed distribution's, else None."""
    return getattr(sys.modules.get(module), "__version__", None) or distribution_version(distribution)


@functools.lru_cache(maxsize=None)
def distribution_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None (looked up once per process: each
    lookup scans ``sys.path``, and what is installed does not change during a run)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of the distributions ``names``; those not installed are left out."""
    versions = {name: distribution_version(name) for name in names}
    return {name: version for name, version in versions.items() if version}
