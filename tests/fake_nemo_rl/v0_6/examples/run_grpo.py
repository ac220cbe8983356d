"""Stand-in for NeMo-RL 0.6's ``examples/run_grpo.py``: the same steps in the same order.

Load the YAML and resolve it (``${...}`` interpolations are fixed here), move ``logger.log_dir`` to
a fresh ``exp_NNN`` (``get_next_experiment_dir``), ``init_ray()``, ``setup(...)``, ``grpo_train(...)``.
Nothing in it knows about the plugin.
"""

from nemo_rl.algorithms.grpo import grpo_train, setup
from nemo_rl.distributed.virtual_cluster import init_ray
from nemo_rl.utils.config import load_recipe_config
from nemo_rl.utils.logger import get_next_experiment_dir


def main():
    config = load_recipe_config()  # upstream: argparse, load_config, parse_hydra_overrides, OmegaConf.to_container
    config["logger"]["log_dir"] = get_next_experiment_dir(config["logger"]["log_dir"])
    print(f"Using log directory: {config['logger']['log_dir']}", flush=True)
    init_ray()
    (
        policy,
        policy_generation,
        _cluster,  # upstream: cluster (unused by main)
        dataloader,
        val_dataloader,
        loss_fn,
        logger,
        checkpointer,
        grpo_state,
        master_config,
    ) = setup(config, None, None, None)
    grpo_train(
        policy,
        policy_generation,
        dataloader,
        val_dataloader,
        None,
        loss_fn,
        None,
        None,
        logger,
        checkpointer,
        grpo_state,
        master_config,
    )
    print("stand-in run_grpo: finished", flush=True)


if __name__ == "__main__":
    main()
