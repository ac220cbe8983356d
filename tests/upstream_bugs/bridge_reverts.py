"""Upstream fixes taken back out of the installed Megatron-Bridge, in the training side's process only
(``training_side.py``): the shared venv is never edited. Each revert is the smallest change that
restores the code before the fix, made to the method's own source (recompiled in its module, with
its class for ``super()``) for as long as the ``reverted`` block runs, then undone.

Megatron-Bridge 0.6.2 is the installed version (lane nemo_rl); the sources the reverts name are its.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """In ``module``'s ``cls.method``, each fixed text becomes the code before the fix: ``(fixed, before)``."""

    module: str
    cls: str
    method: str
    changes: tuple[tuple[str, str], ...]


#: Upstream fix -> the edits that take it back out.
REVERTS: dict[str, tuple[Edit, ...]] = {
    # Megatron-Bridge #2656 (5fcab34f8, in v0.4.0+): Hugging Face's sliding_window W became
    # window_size (W - 1, 0); before it, (W, 0): W + 1 tokens visible. gpt-oss's bridge hard-coded (128, 0).
    "megatron-bridge-2656": (
        Edit(
            "megatron.bridge.models.mistral.mistral_bridge",
            "MistralBridge",
            "provider_bridge",
            (("window_size = [hf_config.sliding_window - 1, 0]", "window_size = [hf_config.sliding_window, 0]"),),
        ),
        Edit(
            "megatron.bridge.models.gemma.gemma2_bridge",
            "Gemma2Bridge",
            "provider_bridge",
            (
                (
                    "provider.window_size = (hf_config.sliding_window - 1, 0)",
                    "provider.window_size = (hf_config.sliding_window, 0)",
                ),
            ),
        ),
        Edit(
            "megatron.bridge.models.gpt_oss.gpt_oss_bridge",
            "GPTOSSBridge",
            "provider_bridge",
            (
                (
                    "provider.window_size = (hf_pretrained.config.sliding_window - 1, 0)",
                    "provider.window_size = (128, 0)",
                ),
            ),
        ),
    ),
    # Megatron-Bridge #4875 (1c0174012, v0.6.0): Gemma 2's window on odd one-based layers (Hugging
    # Face's even layer indices); before it, on even ones: every layer the other kind.
    "megatron-bridge-4875": (
        Edit(
            "megatron.bridge.models.gemma.gemma2_provider",
            "Gemma2DotProductAttention",
            "__init__",
            (("if self.layer_number % 2 == 1:", "if self.layer_number % 2 == 0:"),),
        ),
    ),
    # Megatron-Bridge #1155 (4ea0f70ec, v0.3.0+): gpt-oss's yarn_mscale and yarn_mscale_all_dim None,
    # so megatron-core applies YaRN's attention factor (0.1 ln 32 + 1); before it, both 1.0: factor 1.
    "megatron-bridge-1155": (
        Edit(
            "megatron.bridge.models.gpt_oss.gpt_oss_bridge",
            "GPTOSSBridge",
            "provider_bridge",
            (
                ("provider.yarn_mscale = None", "provider.yarn_mscale = 1.0"),
                ("provider.yarn_mscale_all_dim = None", "provider.yarn_mscale_all_dim = 1.0"),
            ),
        ),
    ),
}


def _recompiled(edit: Edit, original) -> object:
    """``original`` (a function) compiled again from its source with ``edit`` made, in its module's
    namespace, ``__class__`` bound to its class (so a zero-argument ``super()`` works as before)."""
    module = importlib.import_module(edit.module)
    source = textwrap.dedent(inspect.getsource(original))
    for fixed, before in edit.changes:
        count = source.count(fixed)
        if count != 1:
            raise RuntimeError(
                f"{edit.module}.{edit.cls}.{edit.method} holds {fixed!r} {count} times, not once: "
                "the installed Megatron-Bridge is not the one this revert was written for"
            )
        source = source.replace(fixed, before)
    factory = "def _factory(__class__):\n" + textwrap.indent(source, "    ") + f"\n    return {original.__name__}\n"
    namespace: dict[str, object] = {}
    exec(compile(factory, f"<{edit.module} without the fix>", "exec"), vars(module), namespace)
    return namespace["_factory"](getattr(module, edit.cls))  # type: ignore[operator]


@contextlib.contextmanager
def reverted(name: str | None) -> Iterator[None]:
    """Megatron-Bridge without the upstream fix ``name`` (a key of ``REVERTS``; None: as installed)."""
    if name is None:
        yield
        return
    saved = []
    try:
        for edit in REVERTS[name]:
            cls = getattr(importlib.import_module(edit.module), edit.cls)
            original = cls.__dict__[edit.method]
            saved.append((cls, edit.method, original))
            setattr(cls, edit.method, _recompiled(edit, original))
        yield
    finally:
        for cls, method, original in reversed(saved):
            setattr(cls, method, original)
