"""``check`` where Transformer Engine is installed and the GPU asked about is this machine's: TE's
selector runs in the process, and it answers what the committed table says for that TE version."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest

from tests.real_te import require_te

require_te()

from tests.real_te import stand_ins  # noqa: E402

stand_ins.install()

from nemo_rl_attn_align.cli import check  # noqa: E402
from nemo_rl_attn_align.kernels import gpu as gpus  # noqa: E402
from nemo_rl_attn_align.kernels.gpu import capability  # noqa: E402
from nemo_rl_attn_align.kernels.kernel_prediction import predict_training  # noqa: E402
from nemo_rl_attn_align.kernels.kernel_query import KernelOptions, TrainingQuery  # noqa: E402
from tests.conftest import EXAMPLES  # noqa: E402

pytestmark = pytest.mark.real_te

CASES = [
    ("sm90", []),
    ("sm90", ["policy.megatron_cfg.attention_backend=auto"]),
    ("sm80", ["policy.megatron_cfg.attention_backend=fused", "policy.megatron_cfg.context_parallel_size=2",
              "++policy.megatron_cfg.env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"]),
    ("sm100", ["policy.megatron_cfg.attention_backend=unfused", "policy.megatron_cfg.context_parallel_size=2"]),
    ("sm103", ["++policy.megatron_cfg.model_overrides.kv_channels=256"]),
    ("sm89", ["policy.megatron_cfg.attention_backend=auto"]),
    ("sm120", ["++policy.megatron_cfg.model_overrides.kv_channels=256"]),
]  # fmt: skip


def _words(reasons) -> list[str]:
    return [re.sub(r"\d+", "N", reason) for reason in reasons]


@pytest.mark.parametrize(("gpu", "overrides"), CASES)
def test_live_selector_answers_like_the_table(gpu, overrides, monkeypatch):
    monkeypatch.setattr(gpus, "local_gpu", lambda: (gpu, "declared by the test"))
    with stand_ins.declared_device(capability(gpu), flash_attn="2.8.3"):
        kernels = check.evaluate(EXAMPLES / "grpo_math_1B_megatron_flash.yaml", overrides, environ={})["kernels"]
    (training,) = kernels["training"]
    assert training["source"].endswith("get_attention_backend, run here"), training
    query = TrainingQuery(
        **{**training["query"], "flash_switches": tuple(map(tuple, training["query"]["flash_switches"]))}
    )
    table = predict_training(query, KernelOptions(te=version("transformer-engine")))
    assert "from the table" in table.source
    # TE's reasons quote the shape, which the table holds fixed (16/8 heads, 4096 tokens): compare their words
    assert (training["kernel"], training["version"], _words(training["reasons"])) == (
        table.kernel,
        table.version,
        _words(table.reasons),
    )
    errors = [f for f in kernels["findings"] if f["code"] == "TE_NO_BACKEND"]
    assert bool(errors) == (training["kernel"] is None)
