"""Stand-in for ``nemo_rl/models/policy/workers/megatron_policy_worker.py`` (NeMo-RL 0.5.x, v0.5.0).

0.5.x builds the model config inline in ``MegatronPolicyWorker.__init__`` (no ``attention_backend``
key, no ``nemo_rl.models.megatron.setup``) and builds the model in the module-level
``setup_megatron_model(policy_cfg, cfg, load_optimizer, ...)``, which returns
``(state, model, optimizer, scheduler, checkpointing_context)``.
"""

from types import SimpleNamespace

import torch

from tests.fake_nemo_rl.cpu_megatron import TINY_MODEL, StandInGPTProvider, build_gpt, cpu_forward


def setup_megatron_model(
    policy_cfg, cfg, load_optimizer=True, get_embedding_ranks=None, get_position_embedding_ranks=None
):
    model = [build_gpt(cfg.model)]
    return None, model, None, None, {}


class MegatronPolicyWorker:
    def __init__(
        self,
        config,
        tokenizer=None,
        weights_path=None,
        optimizer_path=None,
        init_optimizer=True,
        init_reference_model=True,
        *,
        worker_sharding_annotations=None,
        **kwargs,
    ):
        self.cfg = config
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            config["precision"]
        ]
        model_cfg = StandInGPTProvider(**{**TINY_MODEL, **config.get("standin_model", {})}, use_cpu_initialization=True)
        mcfg = self.cfg["megatron_cfg"]
        model_cfg.tensor_model_parallel_size = mcfg["tensor_model_parallel_size"]
        model_cfg.pipeline_model_parallel_size = mcfg["pipeline_model_parallel_size"]
        model_cfg.context_parallel_size = mcfg["context_parallel_size"]
        model_cfg.sequence_parallel = mcfg["sequence_parallel"]
        model_cfg.bf16 = self.dtype == torch.bfloat16
        model_cfg.fp16 = self.dtype == torch.float16
        model_cfg.params_dtype = self.dtype
        model_cfg.pipeline_dtype = self.dtype
        model_cfg.parallel_output = True
        model_cfg.apply_rope_fusion = mcfg["apply_rope_fusion"]
        self.megatron_cfg = SimpleNamespace(model=model_cfg, train=SimpleNamespace(micro_batch_size=1))
        _, self.model, _, _, _ = setup_megatron_model(
            policy_cfg=self.cfg, cfg=self.megatron_cfg, load_optimizer=init_optimizer
        )

    def get_logprobs(self):
        return cpu_forward(self.model).log_softmax(-1)
