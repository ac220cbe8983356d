"""``config.overrides.apply_override`` (OmegaConf's public API only) applies an override exactly as
Hydra's config loader does (``ConfigLoaderImpl._apply_overrides_to_config``, what NeMo-RL's
``parse_hydra_overrides`` calls; imported here only, as the oracle): the same config after it, or
the same refusal, over thousands of generated overrides (issue #40, item 7: no private imports in
the package). The nemo_rl lane compares the whole loader with NeMo-RL's own."""

from __future__ import annotations

import copy
import random

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from nemo_rl_attn_align.config.loader import compose_config
from nemo_rl_attn_align.config.overrides import apply_override
from tests.conftest import EXAMPLES

PREFIXES = ["", "+", "++", "~"]
VALUES = ["", "=1", "=null", "=[1,2]", "={a:1}", "=x", "=${policy.precision}", "=true", "=bfloat16", "=4096"]


def keys_of(cfg, prefix=""):
    out = []
    for key in cfg.keys():
        path = f"{prefix}{key}"
        out.append(path)
        node = OmegaConf.select(cfg, path, throw_on_resolution_failure=False)
        if OmegaConf.is_dict(node):
            out += keys_of(node, path + ".")
    return out


def outcome(apply, cfg, override):
    try:
        apply(cfg, override)
    except Exception as err:
        message = str(err).splitlines()[0] if str(err) else ""
        return "refused", message
    return "applied", OmegaConf.to_container(cfg, resolve=False)


def test_every_generated_override_applies_as_hydra_applies_it():
    base = compose_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
    OmegaConf.set_struct(base, True)
    keys = [*keys_of(base), "policy.nope", "nope", "policy.generation.vllm_kwargs.new_key", "policy.precision.x"]
    parser, rng = OverridesParser.create(), random.Random(40)
    seen = set()
    for _ in range(300):
        text = f"{rng.choice(PREFIXES)}{rng.choice(keys)}{rng.choice(VALUES)}"
        try:
            [override] = parser.parse_overrides(overrides=[text])
        except Exception:  # not an override: the loader refuses it before applying anything
            continue
        theirs = outcome(
            lambda cfg, o: ConfigLoaderImpl._apply_overrides_to_config(overrides=[o], cfg=cfg),
            copy.deepcopy(base),
            override,
        )
        ours = outcome(apply_override, copy.deepcopy(base), override)
        assert ours == theirs, text
        seen.add(theirs[0])
    assert seen == {"applied", "refused"}
