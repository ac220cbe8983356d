"""Stand-in for NeMo-RL 0.6's ``examples/run_sft.py``: load, move ``logger.log_dir`` to ``exp_NNN``,
``init_ray()``, ``setup(...)``, ``sft_train(...)``. Nothing in it knows about the plugin."""

from nemo_rl.algorithms.sft import setup, sft_train
from nemo_rl.distributed.virtual_cluster import init_ray
from nemo_rl.utils.config import load_recipe_config
from nemo_rl.utils.logger import get_next_experiment_dir


def main():
    config = load_recipe_config()  # upstream: argparse, load_config, parse_hydra_overrides, OmegaConf.to_container
    config["logger"]["log_dir"] = get_next_experiment_dir(config["logger"]["log_dir"])
    init_ray()
    policy, _cluster, train_dataloader, val_dataloader, loss_fn, logger, checkpointer, sft_state, master_config = setup(
        config, None, None, None
    )
    sft_train(policy, train_dataloader, val_dataloader, None, loss_fn, master_config, logger, checkpointer, sft_state)
    print("stand-in run_sft: finished", flush=True)


if __name__ == "__main__":
    main()
