"""CPU stand-in for Transformer Engine: what lets Megatron-Bridge import where TE cannot load.

Megatron-Bridge imports ``transformer_engine`` unconditionally; the real package cannot load
without CUDA libraries. Where no ``transformer_engine`` is installed, ``install`` puts a finder at
the end of ``sys.meta_path`` (a real install always wins) that makes every ``transformer_engine.*``
module on import: in it, a CamelCase name is a ``torch.nn.Module`` subclass (Megatron registers TE
layers as modules), any other name a callable submodule returning None. Nothing of it runs in a
forward built with megatron-core's local layer spec. The probe's Megatron-Bridge side
(``bridge_side.py``) installs it in its own process only where TE is absent, and says so in its
output; the real-NeMo-RL test lane loads it through ``tests/real_nemo_rl/stand_ins``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STAND_IN_TE_VERSION = "2.8.0"
#: How the probe's output names it.
NAME = "CPU stand-in for Transformer Engine"


class _StandInModule(types.ModuleType):
    """A ``transformer_engine`` module: a CamelCase attribute is a ``torch.nn.Module`` subclass, any
    other is a submodule of the same kind that can also be called (returning None), because TE's
    lower-case names are both (``te.common.recipe``, ``te.pytorch.fp8_autocast(...)``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value: object
        if name[:1].isupper() and not name.isupper():
            import torch

            value = type(
                name,
                (torch.nn.Module,),
                {"__module__": self.__name__, "__init__": lambda self, *a, **k: torch.nn.Module.__init__(self)},
            )
        else:
            value = importlib.import_module(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return None


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []  # a package: any submodule can be imported
        if module.__name__ == "transformer_engine":
            module.__version__ = STAND_IN_TE_VERSION


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Makes ``transformer_engine`` and its submodules (last on ``sys.meta_path``: a real install wins)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformer_engine" and not fullname.startswith("transformer_engine."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)


def install() -> None:
    """Put the stand-in at the end of ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        sys.meta_path.append(_StandInFinder())


def install_if_absent() -> bool:
    """``install`` where no real ``transformer_engine`` can be found; whether the stand-in is in use."""
    if any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        return True
    if importlib.util.find_spec("transformer_engine") is not None:
        return False
    install()
    return True
