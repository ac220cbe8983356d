"""Stand-ins for what cannot load on a CPU machine, for running NeMo-RL's own code and tests here.

Loaded as a pytest plugin (``-p attn_align_stand_ins``, this folder on ``PYTHONPATH``) or imported,
before anything imports megatron-bridge. Two stand-ins, nothing else:

* ``transformer_engine``: the real package cannot load without CUDA libraries, and megatron-bridge
  imports it unconditionally. The plugin's ``nemo_rl_attn_align/probe/te_stand_in.py`` (the probe's
  Megatron-Bridge side needs it at run time) is its one home; only used where no real Transformer
  Engine is installed.
* names megatron-core 0.19.2 lacks (``ALIASES``): ``FullyShardedDataParallelV1`` / ``V2``, which
  NeMo-RL 7ea279a's worker imports (aliases of ``FullyShardedDataParallel``), and
  ``megatron.training.utils.unwrap_model``, which v0.6.0 imports (now ``megatron.core.utils``);
  each only where the module lacks it.
"""

from __future__ import annotations

import importlib

from nemo_rl_attn_align.probe import te_stand_in


def install_transformer_engine() -> None:
    """Put the Transformer Engine stand-in at the end of ``sys.meta_path`` (idempotent)."""
    te_stand_in.install()


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
