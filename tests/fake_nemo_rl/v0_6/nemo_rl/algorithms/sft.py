"""Stand-in for ``nemo_rl/algorithms/sft.py`` (NeMo-RL 0.6): ``setup`` and ``sft_train``.

``setup(master_config, tokenizer, train_dataset, val_dataset)`` builds the Megatron policy worker
group and blocks on it (upstream's ``policy.print_node_ip_and_gpu_id()``); there is no generation.
``sft_train`` runs ``sft.max_num_steps`` steps, each one forward and its ``loss`` logged with
``prefix="train"``.
"""

import torch

from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.models.policy.lm_policy import Policy
from nemo_rl.utils.logger import Logger


def setup(master_config, tokenizer, train_dataset, val_dataset):
    cluster_cfg = master_config["cluster"]
    cluster = RayVirtualCluster(cluster_cfg["num_nodes"], cluster_cfg["gpus_per_node"])
    policy = Policy(cluster, master_config["policy"], tokenizer)
    policy.print_node_ip_and_gpu_id()
    logger = Logger(master_config["logger"])
    return policy, cluster, None, None, None, logger, None, {}, master_config


def sft_train(
    policy, train_dataloader, val_dataloader, tokenizer, loss_fn, master_config, logger, checkpointer, sft_save_state
):
    for step in range(1, master_config["sft"]["max_num_steps"] + 1):
        logprobs = torch.cat(policy.get_logprobs()).float()
        logger.log_metrics({"loss": float(-logprobs.max(-1).values.mean())}, step, prefix="train")
        print(f"stand-in sft_train: step {step} done", flush=True)
