"""Stand-ins for reading vLLM's models on this CPU machine: ``torchvision``, and MoE layers vLLM's CPU
platform refuses to build.

vLLM's multimodal model modules import transformers' image processors, which import
``torchvision.transforms`` at module level; the lane's venv has no torchvision (PyPI's build needs
CUDA libraries, ``operator torchvision::nms does not exist``). Building such a model on the meta
device, as ``hosts.model_readers.read_vllm`` does, processes no image, so every ``torchvision.*``
module is made on import here: a CamelCase name is an empty class (``InterpolationMode`` an enum),
any other a submodule of the same kind. The finder is last on ``sys.meta_path``: a real torchvision
wins. ``sitecustomize.py`` beside this file installs it in every interpreter that has this folder
on ``PYTHONPATH`` (vLLM inspects model classes in subprocesses).

``build_refused_moe_empty()`` (called by the architecture table's generator before any vLLM model
module is imported) makes vLLM's ``FusedMoEFactory`` give an empty module where the CPU platform
refuses the MoE layer ("is_act_and_mul=False is supported only for CUDA...", "No Unquantized MoE
backend supports the deployment configuration"), instead of stopping the model build: the
attention layers are what is read. ``parse_configs_once()`` turns off vLLM's retries of a config
it cannot parse (two seconds each).
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

INTERPOLATION_MODES = "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            value = enum.Enum("InterpolationMode", INTERPOLATION_MODES)
        elif name[:1].isupper():
            value = type(name, (), {"__init__": lambda self, *a, **k: None, "__module__": self.__name__})
        else:
            value = importlib.import_module(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        if module.__name__ == "torchvision":
            module.__version__ = "0.0.0+stand-in"


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision" and not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)


def install() -> None:
    """Put the torchvision stand-in at the end of ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        sys.meta_path.append(_StandInFinder())


def parse_configs_once() -> None:
    """vLLM's ``with_retry`` without retries: a sampled config that transformers refuses is refused
    at once, not after two seconds (no network is read here, so nothing is transient)."""
    from vllm.transformers_utils import repo_utils

    repo_utils.with_retry.__defaults__ = (1, 0, ())


def build_refused_moe_empty() -> None:
    """vLLM's ``FusedMoEFactory``, giving an empty module where this platform refuses the layer."""
    import torch
    from vllm.model_executor.layers import fused_moe
    from vllm.model_executor.layers.fused_moe import layer

    original = layer.FusedMoEFactory
    if getattr(original, "_attn_align_stand_in", False):
        return

    def factory(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except NotImplementedError:
            return torch.nn.Module()

    factory._attn_align_stand_in = True  # type: ignore[attr-defined]
    layer.FusedMoEFactory = fused_moe.FusedMoEFactory = factory


install()
