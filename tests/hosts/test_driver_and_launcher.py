"""The driver hook (algorithm ``setup``) and the explicit launcher ``nemo-rl-attn-align run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nemo_rl_attn_align.hosts import bootstrap, driver_report, handoff, nemo_rl_driver
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.errors import RuleViolation
from tests.hosts.conftest import FAKE_NEMO_RL, standin


def master_config(tmp_path, precision="bfloat16", **align):
    """A GRPO master config for the stand-in ``setup()`` with worker groups of size 0 (no Ray)."""
    return {
        "cluster": {"num_nodes": 1, "gpus_per_node": 0},
        "policy": {
            "precision": precision,
            "megatron_cfg": {
                "enabled": True,
                "attention_backend": "flash",
                "pipeline_dtype": precision,
                # NeMo-RL's Policy indexes these three (MEGATRON_KEY_MISSING without them)
                "tensor_model_parallel_size": 1,
                "pipeline_model_parallel_size": 1,
                "context_parallel_size": 1,
            },
        },
        "logger": {"log_dir": str(tmp_path / "logs" / "exp_001")},
        "attention_align": {"on_mismatch": "warn", **align},
    }


@pytest.fixture
def grpo(bootstrap_state, monkeypatch):
    for name in (handoff.SETTINGS_ENV, handoff.REPORT_DIR_ENV, handoff.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    with standin(FAKE_NEMO_RL / "v0_6", "nemo_rl"):
        from nemo_rl.algorithms.grpo import setup  # by name, as examples/run_grpo.py does

        yield setup
    nemo_rl_driver.detach()
    os.environ.pop(handoff.SETTINGS_ENV, None)


def test_setup_exports_settings_every_worker_then_sees(grpo, tmp_path, capsys):
    policy = grpo(master_config(tmp_path, strict=True), None, None, None)[0]
    settings = handoff.worker_settings(policy.worker_group.env_vars)  # what RayWorkerGroup hands each actor
    report_dir = str(tmp_path / "logs" / "exp_001" / "attention_align")
    assert settings == handoff.WorkerSettings(
        strict=True, report_dir=report_dir, run_id=driver_report.current.run.run_id
    )
    assert (
        "nemo-rl-attn-align report: verdict INCOMPARABLE" in capsys.readouterr().out
    )  # collected once setup() returned


def test_a_config_that_cannot_work_stops_before_any_worker(grpo, tmp_path):
    with pytest.raises(RuleViolation) as err:
        grpo(master_config(tmp_path, precision="float32"), None, None, None)
    assert [f.code for f in err.value.findings] == ["FLASH_REQUIRES_HALF_PRECISION"]
    assert handoff.SETTINGS_ENV not in os.environ and driver_report.current is None


def test_pydantic_master_config_is_read_too(grpo, tmp_path):
    from pydantic import BaseModel, ConfigDict

    class MasterConfig(BaseModel):  # NeMo-RL 7ea279a: pydantic, extra="allow"
        model_config = ConfigDict(extra="allow")

    policy = grpo(MasterConfig(**master_config(tmp_path)), None, None, None)[0]
    assert json.loads(policy.worker_group.env_vars[handoff.SETTINGS_ENV])["report_dir"].endswith(
        os.path.join("exp_001", "attention_align")
    )


def run_cli(*args, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("NEMO_RL_ATTN_ALIGN")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "run", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


SHOW_ENV = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
    "('PYTHONPATH', 'NEMO_RL_ATTN_ALIGN_REPORT_DIR', 'NEMO_RL_ATTN_ALIGN_STRICT')}))"
)


def test_launcher_puts_the_shim_and_settings_in_the_command_env(tmp_path):
    out = run_cli("--report-dir", str(tmp_path), "--strict", "--", sys.executable, "-c", SHOW_ENV)
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == bootstrap.SHIM_DIR
    assert env["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] == str(tmp_path) and env["NEMO_RL_ATTN_ALIGN_STRICT"] == "1"


def test_launcher_off_switch_and_bad_commands(tmp_path):
    off = run_cli("--", sys.executable, "-c", SHOW_ENV, NEMO_RL_ATTN_ALIGN="0")
    assert json.loads(off.stdout)["PYTHONPATH"] is None and "runs without the plugin" in off.stderr
    assert run_cli().returncode == 2
    missing = run_cli("--", "no-such-command-here")
    assert missing.returncode == 2 and "cannot run 'no-such-command-here'" in missing.stderr


@pytest.mark.nemo_rl
def test_real_nemo_rl_driver_seams_are_wrapped(bootstrap_state):
    pytest.importorskip("nemo_rl", reason="NeMo-RL is not installed here (it is not on PyPI)")
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    try:
        import nemo_rl.algorithms.grpo as grpo
        import nemo_rl.algorithms.sft as sft
        from nemo_rl.utils.logger import Logger
    except ImportError as err:  # its algorithm modules need torch, ray, vLLM ...: NeMo-RL's own environment
        pytest.skip(f"NeMo-RL's algorithm modules do not import here: {err}")
    try:
        seams = [grpo.setup, grpo.grpo_train, sft.setup, sft.sft_train, Logger.log_metrics]
        assert [_patching.is_wrapped(seam) for seam in seams] == [True] * len(seams)
    finally:
        nemo_rl_driver.detach()


def test_preset_aligned_writes_the_settings_before_any_worker_starts(grpo, tmp_path, capsys):
    config = master_config(tmp_path, preset="aligned")
    config["policy"]["generation"] = {
        "backend": "vllm",
        "vllm_cfg": {"env_vars": None, "tensor_parallel_size": 1},
        "colocated": {"resources": {"num_nodes": 1, "gpus_per_node": 0}},
    }
    config["policy"]["megatron_cfg"]["env_vars"] = None
    grpo(config, None, None, None)
    assert config["policy"]["generation"]["vllm_cfg"]["env_vars"] == {"VLLM_BATCH_INVARIANT": "1"}
    assert config["policy"]["megatron_cfg"]["env_vars"] == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    report = json.loads((tmp_path / "logs" / "exp_001" / "attention_align" / "attention_align_report.json").read_text())
    preset = report["settings"]["preset"]
    assert [c["key"] for c in preset["changes"]] == [
        "policy.generation.vllm_cfg.env_vars.VLLM_BATCH_INVARIANT",
        "policy.megatron_cfg.env_vars.CUBLAS_WORKSPACE_CONFIG",
    ]
    assert preset["aligned"] is True and "preset aligned changed:" in capsys.readouterr().out
