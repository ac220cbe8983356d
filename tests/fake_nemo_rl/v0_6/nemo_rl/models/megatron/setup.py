"""Stand-in for ``nemo_rl/models/megatron/setup.py`` (NeMo-RL >= 0.6, read at 7ea279a).

Same names, signatures and call chain: ``validate_and_set_config`` -> ``setup_model_config`` ->
``_apply_parallelism_config`` / ``_apply_precision_config`` / ``_apply_performance_config`` (through
the module globals) -> ``__post_init__``; ``setup_model_and_optimizer`` builds the model. The
checkpoint's model config is replaced by ``config["standin_model"]`` and the model is a tiny CPU
GPTModel with the local spec (with ``cpu_megatron.PackedAttentionStandIn`` where the policy packs
sequences).
"""

import os
from collections import namedtuple
from types import SimpleNamespace

import torch
from megatron.core.transformer.enums import AttnBackend

from tests.fake_nemo_rl.cpu_megatron import TINY_MODEL, StandInGPTProvider, build_gpt

#: Upstream maps ``megatron_cfg.attention_backend`` since 21337e5 (#1628, v0.6.0). False stands in
#: for main between 5e3f167 (this module appeared) and 21337e5, where it did not.
HAS_ATTENTION_BACKEND = True

RuntimeConfig = namedtuple(
    "RuntimeConfig",
    "megatron_cfg model_cfg dtype optimizer_cpu_offload offload_optimizer_for_logprob "
    "offload_optimizer_for_refit is_generation_colocated sampling_params final_padded_vocab_size",
)
ModelAndOptimizerState = namedtuple(
    "ModelAndOptimizerState", "state model optimizer scheduler checkpointing_context param_sync_func"
)


def validate_and_set_config(config, rank, hf_model_name, pretrained_path, weights_path, optimizer_path):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config["precision"]]
    megatron_cfg, model_cfg = setup_model_config(
        config, rank, dtype, hf_model_name, pretrained_path, weights_path, optimizer_path
    )
    return RuntimeConfig(megatron_cfg, model_cfg, dtype, False, False, True, None, None, model_cfg.vocab_size)


def setup_model_config(config, rank, dtype, hf_model_name, pretrained_path, weights_path=None, optimizer_path=None):
    model_cfg = StandInGPTProvider(**{**TINY_MODEL, **config.get("standin_model", {})}, use_cpu_initialization=True)
    _apply_parallelism_config(model_cfg, config)
    _apply_precision_config(model_cfg, config, dtype)
    _apply_performance_config(model_cfg, config)
    model_cfg.__post_init__()
    megatron_cfg = SimpleNamespace(model=model_cfg, train=SimpleNamespace(micro_batch_size=1))
    return megatron_cfg, model_cfg


def _apply_parallelism_config(model_cfg, config):
    mcfg = config["megatron_cfg"]
    model_cfg.tensor_model_parallel_size = mcfg["tensor_model_parallel_size"]
    model_cfg.pipeline_model_parallel_size = mcfg["pipeline_model_parallel_size"]
    model_cfg.context_parallel_size = mcfg["context_parallel_size"]
    model_cfg.sequence_parallel = mcfg["sequence_parallel"]


def _apply_precision_config(model_cfg, config, dtype):
    model_cfg.bf16 = dtype == torch.bfloat16
    model_cfg.fp16 = dtype == torch.float16
    model_cfg.params_dtype = dtype
    model_cfg.pipeline_dtype = dtype


def _apply_performance_config(model_cfg, config):
    model_cfg.parallel_output = True
    model_cfg.apply_rope_fusion = config["megatron_cfg"]["apply_rope_fusion"]
    attention_backend = config["megatron_cfg"].get("attention_backend")
    if HAS_ATTENTION_BACKEND and attention_backend is not None:
        for nvte_var in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
            os.environ.pop(nvte_var, None)
        try:
            model_cfg.attention_backend = AttnBackend[attention_backend]
        except KeyError:
            raise ValueError(  # noqa: B904 (as upstream: implicit chaining, no `from`)
                f"Invalid attention backend: {attention_backend}. "
                f"Available backends are: {list(AttnBackend.__members__.keys())}"
            )


def setup_model_and_optimizer(
    policy_cfg,
    megatron_cfg,
    load_optimizer=True,
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    pre_load_checkpoint_hook=None,
    additional_pre_wrap_hooks=None,
    load_weights=True,
):
    model = [build_gpt(megatron_cfg.model, packed=bool((policy_cfg.get("sequence_packing") or {}).get("enabled")))]
    return ModelAndOptimizerState(None, model, None, None, {}, None)
