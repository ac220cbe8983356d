"""Stand-ins for what cannot load on a CPU machine, for running NeMo-RL's own code and tests here.

Loaded as a pytest plugin (``-p attn_align_stand_ins``, this folder on ``PYTHONPATH``) or imported,
before anything imports megatron-bridge. Two stand-ins, nothing else:

* ``transformer_engine``: the real package cannot load without CUDA libraries, and megatron-bridge
  imports it unconditionally. Every ``transformer_engine.*`` module is made on import; in it, a
  CamelCase name is a ``torch.nn.Module`` subclass (Megatron registers TE layers as modules), any
  other name a callable submodule returning None. Only used where no real Transformer Engine is installed.
* names megatron-core 0.19.2 lacks (``ALIASES``): ``FullyShardedDataParallelV1`` / ``V2``, which
  NeMo-RL 7ea279a's worker imports (aliases of ``FullyShardedDataParallel``), and
  ``megatron.training.utils.unwrap_model``, which v0.6.0 imports (now ``megatron.core.utils``);
  each only where the module lacks it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STAND_IN_TE_VERSION = "2.8.0"


class _StandInModule(types.ModuleType):
    """A ``transformer_engine`` module: a CamelCase attribute is a ``torch.nn.Module`` subclass, any
    other is a submodule of the same kind that can also be called (returning None), because TE's
    lower-case names are both (``te.common.recipe``, ``te.pytorch.fp8_autocast(...)``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
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


def install_transformer_engine() -> None:
    """Put the Transformer Engine stand-in at the end of ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        sys.meta_path.append(_StandInFinder())


#: (module, missing name, module, name it aliases): names NeMo-RL imports that megatron-core 0.19.2
#: has elsewhere or under another name.
ALIASES = (
    (
        "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        "FullyShardedDataParallelV1",
        "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        "FullyShardedDataParallel",
    ),
    (
        "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        "FullyShardedDataParallelV2",
        "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        "FullyShardedDataParallel",
    ),
    ("megatron.training.utils", "unwrap_model", "megatron.core.utils", "unwrap_model"),  # NeMo-RL v0.6.0
)


def alias_missing_names() -> None:
    """Add each of ``ALIASES`` where its module lacks the name (nothing else is touched)."""
    for module_name, name, source_name, source_attr in ALIASES:
        try:
            module = importlib.import_module(module_name)
            source = importlib.import_module(source_name)
        except ImportError:
            continue
        if not hasattr(module, name):
            setattr(module, name, getattr(source, source_attr))


install_transformer_engine()
alias_missing_names()
