"""Stand-in for ``nemo_rl/models/policy/workers/megatron_policy_worker.py`` (NeMo-RL >= 0.6).

As upstream, ``validate_and_set_config`` and ``setup_model_and_optimizer`` are imported BY NAME
from ``nemo_rl.models.megatron.setup`` and called from ``MegatronPolicyWorker.__init__``.
"""

import os
import socket

from nemo_rl.models.megatron.setup import setup_model_and_optimizer, validate_and_set_config
from tests.fake_nemo_rl.cpu_megatron import cpu_forward


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
        self.rank = int(os.environ.get("RANK", "0"))
        runtime_config = validate_and_set_config(
            config, self.rank, config["model_name"], "/stand-in/pretrained", weights_path, optimizer_path
        )
        self.megatron_cfg = runtime_config.megatron_cfg
        state = setup_model_and_optimizer(config, self.megatron_cfg, init_optimizer)
        self.model = state.model

    def report_node_ip_and_gpu_id(self):
        return socket.gethostname(), "cpu"

    def get_logprobs(self):
        return cpu_forward(self.model).float().log_softmax(-1)
