"""Chaining ``sitecustomize`` for interpreters that reach the plugin only through ``PYTHONPATH``.

NeMo-RL runs each worker in its own uv venv, without the packages of the driver's environment, but
with the driver's whole environment (``PYTHONPATH`` included) in Ray's runtime_env. The NeMo-RL
driver hook (when it attaches, before ``init_ray()``) and ``nemo-rl-attn-align run --`` put this
directory first on ``PYTHONPATH``; a worker interpreter then imports this file as ``sitecustomize``.
It makes ``nemo_rl_attn_align`` (and only it) importable from where it is installed, activates the
lazy bootstrap, and then runs the ``sitecustomize`` that this file shadows, as ``opentelemetry-instrument``
and ``ddtrace-run`` do. Stdlib only, never raises for its own part.
"""

import os
import sys

# The import machinery's own modules are loaded before any sitecustomize runs; taking PathFinder and
# module_from_spec from them avoids importing importlib.util (contextlib, functools, collections:
# ~3 ms at every start of every worker interpreter).
try:
    _PathFinder = sys.modules["_frozen_importlib_external"].PathFinder
    _module_from_spec = sys.modules["_frozen_importlib"].module_from_spec
except (KeyError, AttributeError):  # pragma: no cover - not CPython
    from importlib.machinery import PathFinder as _PathFinder
    from importlib.util import module_from_spec as _module_from_spec

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = "nemo_rl_attn_align"


class _PluginOnlyFinder:
    """Last-resort finder for the plugin package alone, from the directory that holds it here."""

    root = os.path.dirname(os.path.dirname(_HERE))

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PACKAGE:
            return None
        return _PathFinder.find_spec(fullname, [self.root])


def _activate():
    try:
        if not any(isinstance(f, _PluginOnlyFinder) for f in sys.meta_path):
            sys.meta_path.append(_PluginOnlyFinder())
        from nemo_rl_attn_align.hosts import bootstrap

        bootstrap.activate("shim")
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        sys.stderr.write(f"nemo-rl-attn-align: shim could not activate ({type(exc).__name__}: {first})\n")


def _is_shim_dir(path):
    """This directory, or the shim of another copy of the plugin (never chain into ourselves)."""
    parent, name = os.path.split(path)
    return path == _HERE or (name == "_shim" and os.path.basename(parent) == _PACKAGE)


def _chain():
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this file shadows), if any."""
    rest = [p for p in sys.path if not _is_shim_dir(os.path.abspath(p or os.curdir))]
    spec = _PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = _module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# A worker venv may run an older Python than the plugin supports: there it only chains.
if sys.version_info >= (3, 10):  # noqa: UP036 - the shim is imported by any interpreter on PYTHONPATH
    _activate()
_chain()
