"""Stand-in for ``nemo_rl/algorithms/grpo.py`` (NeMo-RL 0.6): ``setup`` and ``grpo_train``.

``setup(master_config, tokenizer, dataset, val_dataset, processor=None)`` builds the vLLM generation
worker group, then the Megatron policy worker group (upstream's ``init_vllm_then_policy`` order),
each copying the driver's ``os.environ`` into its actors and blocking until they are up, and
returns upstream's 10-tuple. A group of size 0 (``cluster.gpus_per_node: 0``, or no
``policy.generation``) starts no actor and needs no Ray. ``grpo_train`` runs
``grpo.max_num_steps`` steps as upstream orders them: generate, log the rollout metrics
(``prefix="train"``, no loss), score with the policy (its first forward), log the training
metrics with ``loss``, ``token_mult_prob_error`` and ``gen_kl_error``.
"""

import torch

from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration
from nemo_rl.models.policy.lm_policy import Policy
from nemo_rl.utils.logger import Logger


def setup(master_config, tokenizer, dataset, val_dataset, processor=None):
    cfg = master_config.model_dump() if hasattr(master_config, "model_dump") else master_config  # 0.7: pydantic
    cluster_cfg = cfg["cluster"]
    generation = cfg["policy"].get("generation")
    policy_generation = None
    if generation is not None:
        resources = generation["colocated"]["resources"]
        inference_cluster = RayVirtualCluster(resources["num_nodes"], resources["gpus_per_node"])
        policy_generation = VllmGeneration(inference_cluster, generation)
    train_cluster = RayVirtualCluster(cluster_cfg["num_nodes"], cluster_cfg["gpus_per_node"])
    policy = Policy(train_cluster, cfg["policy"], tokenizer)
    policy.print_node_ip_and_gpu_id()
    logger = Logger(cfg["logger"])
    return policy, policy_generation, train_cluster, None, None, None, logger, None, {}, master_config


def grpo_train(
    policy,
    policy_generation,
    dataloader,
    val_dataloader,
    tokenizer,
    loss_fn,
    task_to_env,
    val_task_to_env,
    logger,
    checkpointer,
    grpo_save_state,
    master_config,
    processor=None,
):
    for step in range(1, master_config["grpo"]["max_num_steps"] + 1):
        logger.log_metrics({"mean_gen_tokens_per_sample": 16.0}, step, prefix="train")
        train_lp = torch.cat(policy.get_logprobs()).float()
        gen_lp = train_lp.to(torch.bfloat16).float()  # the rollout side rounds its logprobs to bf16
        metrics = {
            "loss": float(-train_lp.max(-1).values.mean()),
            "token_mult_prob_error": float(torch.exp((gen_lp - train_lp).abs()).mean()),
            "gen_kl_error": float((gen_lp.exp() * (gen_lp - train_lp)).sum(-1).mean()),
        }
        logger.log_metrics(metrics, step, prefix="train")
        print(f"stand-in grpo_train: step {step} done", flush=True)
