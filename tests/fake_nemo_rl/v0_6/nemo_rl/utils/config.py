"""Stand-in for ``nemo_rl/utils/config.py``: ``load_config`` and ``parse_hydra_overrides`` reduced to
OmegaConf YAML and dotlist overrides, plus ``load_recipe_config`` (a stand-in helper, not upstream:
the steps every upstream recipe repeats before it moves ``logger.log_dir``)."""

import argparse

from omegaconf import OmegaConf


def load_config(path):
    return OmegaConf.load(path)


def parse_hydra_overrides(config, overrides):
    return OmegaConf.merge(config, OmegaConf.from_dotlist(overrides))


def load_recipe_config():
    """``--config PATH`` and overrides from the command line, loaded and resolved to a plain dict."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args, overrides = parser.parse_known_args()
    return OmegaConf.to_container(parse_hydra_overrides(load_config(args.config), overrides), resolve=True)
