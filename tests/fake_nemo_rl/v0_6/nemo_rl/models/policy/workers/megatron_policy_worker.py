"""Stand-in for ``nemo_rl/models/policy/workers/megatron_policy_worker.py`` (NeMo-RL >= 0.6).

As upstream, ``validate_and_set_config`` and ``setup_model_and_optimizer`` are imported BY NAME
from ``nemo_rl.models.megatron.setup`` and called from ``MegatronPolicyWorker.__init__``. With
``sequence_packing.enabled``, ``get_logprobs`` packs ``PACKED_LENGTHS`` sequences into one row
(``data.process_microbatch``) and runs it through ``train.model_forward``, as upstream does.
"""

import os
import socket

import torch

from nemo_rl.models.megatron.data import process_microbatch
from nemo_rl.models.megatron.setup import setup_model_and_optimizer, validate_and_set_config
from nemo_rl.models.megatron.train import model_forward
from nemo_rl_attn_align.probe.megatron_side import cpu_only
from tests.fake_nemo_rl.cpu_megatron import cpu_forward

#: The lengths of the sequences one packed micro-batch holds.
PACKED_LENGTHS = (5, 3, 4)


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
        if not (self.cfg.get("sequence_packing") or {}).get("enabled"):
            return cpu_forward(self.model).float().log_softmax(-1)
        model = self.model[0]
        ids = torch.randint(0, model.vocab_size, (len(PACKED_LENGTHS), max(PACKED_LENGTHS)))
        packed_ids, packed_seq_params = process_microbatch(ids, torch.tensor(PACKED_LENGTHS))
        with cpu_only(), torch.no_grad():
            logits = model_forward(model, {}, packed_ids, None, None, packed_seq_params=packed_seq_params)
        return logits.float().log_softmax(-1)
