"""Interpreter-start activation: stdlib only, lazy, idempotent.

Three doors lead here, all calling ``activate()``:

* ``nemo_rl_attn_align.pth`` in the environment the plugin is installed in (every interpreter of
  that environment processes it at start, like coverage's and autowrapt's ``.pth`` files); its one
  line reads the ``SWITCH`` itself (off: nothing is imported) and turns any failure of the import
  into one line on stderr, once per interpreter (``site`` runs a venv's ``.pth`` files twice when
  ``lib64`` links to ``lib``), never a traceback;
* ``nemo_rl_attn_align/_shim/sitecustomize.py``, for interpreters of *other* environments that
  inherit ``PYTHONPATH`` (NeMo-RL's per-worker uv venvs get the driver's whole environment through
  Ray's ``runtime_env["env_vars"]``); it chains to the next ``sitecustomize`` like
  ``opentelemetry-instrument`` and ``ddtrace-run`` do;
* ``nemo-rl-attn-align run -- CMD`` (``cli/run.py``), where nothing automatic is allowed.

Only two places put the shim on ``PYTHONPATH`` (``export_shim``): the NeMo-RL driver hook when it
attaches (``nemo_rl_driver.attach``, at the recipe's import of the algorithm module, before
``init_ray()`` copies ``os.environ`` into the job's ``runtime_env``) and ``run --``. Activation
itself changes no environment variable, so pip, pytest or a notebook in the plugin's environment
pass nothing new to the processes they start.

``activate()`` imports no host library. It installs one ``sys.meta_path`` finder that wraps the
loader of the few modules in ``WATCHED`` (those of the hooks' seams, ``seams.HOOKS``); when such a
module has finished executing, the host module that patches it is imported and attached.
``NEMO_RL_ATTN_ALIGN=0`` turns all of it off. The callback table is guarded by one lock (as wrapt's
post-import hooks are); callbacks run outside it.
"""

# No ``from __future__ import annotations`` here: importing ``__future__`` alone costs ~0.2 ms at
# every interpreter start, and the annotations below evaluate fine on Python 3.10+.
import _thread
import os
import sys

from nemo_rl_attn_align.hosts.seams import HOOKS

#: Master switch: ``0`` / ``false`` / ``no`` / ``off`` (any case) turn the plugin off everywhere.
SWITCH = "NEMO_RL_ATTN_ALIGN"
_OFF_VALUES = frozenset({"0", "false", "no", "off"})

#: The directory holding the chaining ``sitecustomize.py`` that child interpreters pick up.
SHIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_shim")

#: Host modules (under ``nemo_rl_attn_align.hosts``) keyed by the module each one patches.
WATCHED = dict(sorted({seam.module: hook for hook, declared in HOOKS.items() for seam in declared.seams}.items()))

#: module name -> callbacks run with the module once it has executed (or at once if it already has).
_callbacks: dict[str, list] = {}
#: Guards ``_callbacks``, the finder's place on ``sys.meta_path`` and ``_LazyHost`` instances. The C
#: lock of ``_thread`` (always loaded): importing ``threading`` would cost every interpreter start.
_lock = _thread.RLock()
#: How this process was activated ("pth", "shim", "run", "entry_point", ...); None while inactive.
origin: str | None = None


def enabled(environ=os.environ) -> bool:
    """False when ``NEMO_RL_ATTN_ALIGN`` is set to 0/false/no/off."""
    return environ.get(SWITCH, "1").strip().lower() not in _OFF_VALUES


def warn(message: str) -> None:
    """One line on stderr; safe to call during interpreter start."""
    try:
        sys.stderr.write(f"nemo-rl-attn-align: {message}\n")
    except Exception:  # pragma: no cover - stderr closed
        pass


def activate(how: str = "pth") -> bool:
    """Turn the plugin on in this interpreter; returns False when switched off. Never raises."""
    global origin
    if not enabled():
        return False
    try:
        for target, host in WATCHED.items():
            watch(target, _LazyHost.get(host))
    except Exception as exc:
        warn(f"activation failed ({type(exc).__name__}: {exc}); running without the plugin")
        return False
    if origin is None:
        origin = how
    return True


def deactivate() -> None:
    """Remove every pending hook and the import finder (already patched modules stay patched)."""
    global origin
    with _lock:
        _callbacks.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportFinder)]
    origin = None


def export_shim(environ) -> bool:
    """Put ``SHIM_DIR`` first on ``environ["PYTHONPATH"]`` so child interpreters activate too;
    False when it is there already."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SHIM_DIR in entries:
        return False
    environ["PYTHONPATH"] = os.pathsep.join([SHIM_DIR, *entries])
    return True


def withdraw_shim(environ) -> None:
    """Take ``SHIM_DIR`` off ``environ["PYTHONPATH"]`` again (unset when nothing else is on it)."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHIM_DIR]
    if entries:
        environ["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        environ.pop("PYTHONPATH", None)


def watch(module_name: str, callback) -> None:
    """Run ``callback(module)`` when ``module_name`` has executed, or now if it already has.

    Registering the same callback twice is a no-op. A module that is still executing is called back
    when it has finished (if it was watched when its import began). A callback's exception is reported and
    swallowed unless it carries ``stops_run = True`` (strict mode), which propagates to the import.
    """
    with _lock:
        registered = _callbacks.setdefault(module_name, [])
        if callback in registered:
            return
        registered.append(callback)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
    module = sys.modules.get(module_name)
    # A module still executing (it is importing something that triggered us) is not ready; its
    # notifying loader calls back when it has finished.
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        _run(callback, module)


def unwatch(module_name: str, callback) -> None:
    """Forget ``callback`` for ``module_name``."""
    with _lock:
        registered = _callbacks.get(module_name, [])
        if callback in registered:
            registered.remove(callback)


def _run(callback, module) -> None:
    try:
        callback(module)
    except Exception as exc:
        if getattr(exc, "stops_run", False):
            raise
        warn(f"hook for {module.__name__} failed ({type(exc).__name__}: {exc}); that module runs unpatched")


def _notify(module) -> None:
    """Run every callback for ``module``, including those its callbacks register meanwhile."""
    done: list = []
    while True:
        with _lock:
            pending = [cb for cb in _callbacks.get(module.__name__, ()) if cb not in done]
        if not pending:
            return
        for callback in pending:
            done.append(callback)
            _run(callback, module)


#: The one ``_LazyHost`` of each host name (written under ``_lock``).
_lazy_hosts: dict[str, "_LazyHost"] = {}


class _LazyHost:
    """Callback that imports ``nemo_rl_attn_align.hosts.<name>`` and calls its ``attach()``."""

    def __init__(self, name: str):
        self.name = name

    @classmethod
    def get(cls, name: str) -> "_LazyHost":
        """One instance per host, so ``watch`` sees the same callback every time."""
        instance = _lazy_hosts.get(name)
        if instance is None:
            with _lock:
                instance = _lazy_hosts.setdefault(name, cls(name))
        return instance

    def __call__(self, module) -> None:
        import importlib

        importlib.import_module(f"nemo_rl_attn_align.hosts.{self.name}").attach()


_UNSET = object()  # a module without ``__loader__`` at all


class _NotifyingLoader:
    """Puts the real loader back on the module, runs it, then notifies the watchers.

    As wrapt's ``_ImportHookChainedLoader`` does: the real loader goes back *before* the module
    executes (its code sees the loader it would see without the plugin), and only where the import
    system put this wrapper (``__loader__`` being it or None, ``__spec__.loader`` being it); a loader
    someone else set stays.
    """

    def __init__(self, loader):
        self._loader = loader

    def _restore_loader(self, module) -> None:
        current = getattr(module, "__loader__", _UNSET)
        if current is None or current is self:
            try:
                module.__loader__ = self._loader
            except AttributeError:  # pragma: no cover - a module type without attribute assignment
                pass
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "loader", None) is self:
            spec.loader = self._loader

    def exec_module(self, module) -> None:
        self._restore_loader(module)
        self._loader.exec_module(module)
        _notify(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder:
    """``sys.meta_path`` entry that only answers for watched names, and then only to wrap the loader."""

    def find_spec(self, fullname, path=None, target=None):
        # One dict lookup needs no lock (it is atomic); this runs for every import in the process.
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _PostImportFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader)
                return spec
        return None
