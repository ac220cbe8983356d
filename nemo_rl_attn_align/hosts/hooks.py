"""A hook attached from its declared seams (``seams.HOOKS``), as wrapt's and OpenTelemetry's
instrumentors do: each seam wrapped where the installed host fits it (a callable at its path whose
parameters start with the ones the wrapper needs), one warning naming what does not fit (an error in
strict mode), everything wrapped put back on detach.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any

from nemo_rl_attn_align.hosts import bootstrap, handoff
from nemo_rl_attn_align.hosts.seams import HOOKS, OPTIONAL, Seam
from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab import patching as _patching

log = logging.getLogger("nemo_rl_attn_align")


def locate(seam: Seam, module: Any) -> tuple[Any, str]:
    """The object holding the seam's last name in ``module`` (None where the path breaks), and that name."""
    *parents, name = seam.path.split(".")
    owner = module
    for part in parents:
        owner = getattr(owner, part, None)
    return owner, name


def fits(seam: Seam, module: Any) -> bool:
    """Whether ``module`` has the seam: a callable at its path, its parameters starting with ``seam.params``."""
    owner, name = locate(seam, module)
    function = getattr(owner, name, None) if owner is not None else None
    if not callable(function):
        return False
    try:
        return tuple(inspect.signature(function).parameters)[: len(seam.params)] == seam.params
    except (TypeError, ValueError):
        return not seam.params


_warned: set[str] = set()


def unsupported(host: str, missing: str) -> None:
    """One warning (once per host and seam) for a layout the plugin does not recognise; an error in strict mode."""
    message = f"{host} {versions.installed_version(host) or '(version unknown)'}: {missing}."
    if handoff.worker_settings().strict:
        raise _patching.HostLayoutError(
            f"{message} attention_align.strict is true, so the run stops here. "
            "Fix: use a supported version, or set attention_align.strict: false to run unrecorded."
        )
    key = f"{host}:{missing}"
    if key not in _warned:
        _warned.add(key)
        log.warning("nemo-rl-attn-align: %s The plugin leaves it untouched and records nothing for it.", message)


def _ready(name: str, patching: Any) -> Any:
    """Module ``name``: the one being patched, else an imported one that has finished executing, else None."""
    if name == patching.__name__:
        return patching
    module = sys.modules.get(name)
    return None if getattr(getattr(module, "__spec__", None), "_initializing", False) else module


class Hook:
    """One hook module's ``attach()`` / ``detach()`` over its seams (``seams.HOOKS[name]``): the
    modules it watches, what it wrapped there. ``patch`` (the default callback) wraps them."""

    def __init__(self, name: str, patch: Callable[[Any], None] | None = None):
        self.name, self.declared = name, HOOKS[name]
        self.modules = tuple(dict.fromkeys(seam.module for seam in self.declared.seams))
        self.callback = patch or self.patch
        self._wrapped: list[tuple[Any, str]] = []

    def attach(self) -> None:
        """Patch each module now if imported, else right after its import (idempotent)."""
        for name in self.modules:
            bootstrap.watch(name, self.callback)

    def detach(self) -> None:
        """Stop watching and put back everything ``wrap`` replaced."""
        for name in self.modules:
            bootstrap.unwatch(name, self.callback)
        while self._wrapped:
            _patching.unwrap(*self._wrapped.pop())

    @property
    def wrapping(self) -> bool:
        """Whether a seam of this hook is wrapped now."""
        return bool(self._wrapped)

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
        """``patching.wrap`` and remember it for ``detach``."""
        done = _patching.wrap(owner, name, make_wrapper)
        if done:
            self._wrapped.append((owner, name))
        return done

    def patch(self, module: Any) -> str | None:
        """Check the host versions (once per process), then wrap the seams of ``module`` (just imported)
        the host fits, with one warning for each it must have and lacks; of its layouts, the first whose
        seams in the modules imported so far all fit. Returns that layout's name."""
        strict = handoff.worker_settings().strict
        for host in self.declared.checks:
            versions.check_supported(host, strict)
        here = [seam for seam in self.declared.seams if seam.module == module.__name__]
        for seam in here:
            if seam.group in (None, OPTIONAL) and not self._wrap_fitting(module, [seam]) and seam.group is None:
                unsupported(self.declared.host, f"{self._describe(module, [seam])} not found")
        layouts = dict.fromkeys(seam.group for seam in here if seam.group not in (None, OPTIONAL))
        choices = [
            [seam for seam in self.declared.seams if seam.group == layout and _ready(seam.module, module)]
            for layout in layouts
        ]
        chosen = next((choice for choice in choices if self._wrap_fitting(module, choice)), None)
        if choices and chosen is None:
            unsupported(
                self.declared.host, " or ".join(self._describe(module, choice) for choice in choices) + " not found"
            )
        return chosen[0].group if chosen else None

    def _wrap_fitting(self, module: Any, seams: list[Seam]) -> bool:
        """Wrap ``seams`` when every one fits (each with its factory in the hook module); else False."""
        modules = [_ready(seam.module, module) for seam in seams]
        if not all(fits(seam, where) for seam, where in zip(seams, modules, strict=True)):
            return False
        hook = sys.modules[f"{__package__}.{self.name}"]
        for seam, where in zip(seams, modules, strict=True):
            self.wrap(*locate(seam, where), functools.partial(getattr(hook, seam.wrapper), seam=seam))
        return True

    def _describe(self, module: Any, seams: list[Seam]) -> str:
        """Those of ``seams`` that do not fit, as a warning names them (a layout's with its host versions)."""
        named = ", ".join(
            f"{seam.module}.{seam.path}" + (f"({', '.join(seam.params)}, ...)" if seam.params else "")
            for seam in seams
            if not fits(seam, _ready(seam.module, module))
        )
        layout = seams[0].group
        if layout in self.declared.layouts:
            return f"{layout} layout ({self.declared.host} {self.declared.layouts[layout]}): {named}"
        return named
