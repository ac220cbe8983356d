"""Where the real NeMo-RL imports, our loader gives exactly what its recipes get.

NeMo-RL is not on PyPI, so this runs only on machines that have it (e.g. inside its container).
"""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.config.loader import load_config
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.nemo_rl
nemo_config = pytest.importorskip("nemo_rl.utils.config", reason="NeMo-RL is not installed here (it is not on PyPI)")


@pytest.mark.parametrize("name", ["grpo_math_1B_megatron_flash.yaml", "sft_megatron_flash.yaml"])
@pytest.mark.parametrize(
    "overrides", [[], ["policy.precision=float32", "++policy.megatron_cfg.context_parallel_size=2"]]
)
def test_same_result_as_nemo_rl(name, overrides):
    from omegaconf import OmegaConf

    nemo_config.register_omegaconf_resolvers()
    cfg = nemo_config.load_config(EXAMPLES / name)
    if overrides:
        cfg = nemo_config.parse_hydra_overrides(cfg, overrides)
    expected = OmegaConf.to_container(cfg, resolve=True)
    assert load_config(EXAMPLES / name, overrides) == expected
