"""Reversible, idempotent function wrapping shared by the host modules (stdlib only).

A wrapper keeps the original under ``ORIGINAL_ATTR``: wrapping twice is a no-op and ``unwrap``
restores exactly what was there. Hosts patch module attributes (functions called through a module
global, or names another module imported by name) and methods on classes.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

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


def distribution_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
