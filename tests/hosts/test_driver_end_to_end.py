"""From worker records to the one run report inside a whole (stand-in) NeMo-RL run.

Each test runs a stand-in recipe (``tests/fake_nemo_rl/v0_6/examples/run_<algo>.py``: load the YAML,
move ``logger.log_dir`` to ``exp_NNN``, ``init_ray()``, ``setup()``, the train function) as its own
driver process, joined to one real local Ray cluster. The driver gets the plugin as a user's does:
from the ``.pth`` of the environment it is installed in (this interpreter's), with no shim on
``PYTHONPATH``; the driver hook exports the shim when the recipe imports the algorithm module. Its
worker groups are Ray actors in their own processes: Megatron policy workers building a tiny real
megatron-core GPTModel on CPU, vLLM generation workers warming up the stand-in ``vllm`` engine (in
the GRPO run, in a venv without the plugin, as NeMo-RL's own venvs are). Nothing in the recipe
knows the plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("ray")
pytest.importorskip("megatron.core")

from nemo_rl_attn_align.report.document import REPORT_FILENAME
from nemo_rl_attn_align.report.load import load_report
from nemo_rl_attn_align.vocab.codes import Code
from tests.fake_nemo_rl.configs import policy_config
from tests.hosts.conftest import FAKE_NEMO_RL, FAKE_VLLM, REPO, venv_without_plugin

pytestmark = pytest.mark.slow
SUMMARY = "nemo-rl-attn-align report: verdict"
VLLM_WORKER = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"


@pytest.fixture(scope="module", autouse=True)
def plugin_installed_here():
    """The drivers below get the plugin from this interpreter's ``.pth``: it must be installed."""
    show = "from nemo_rl_attn_align.hosts import bootstrap; print(bootstrap.origin)"
    out = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, env=driver_env(), timeout=60)
    assert out.stdout.strip() == "pth", (
        f"the plugin's .pth is not active in {sys.executable}. Fix: pip install -e . ({out.stderr[-500:]})"
    )


def recipe_config(tmp_path, *, policy_workers=1, vllm_workers=2, batch_invariant=True, algorithm="grpo", **align):
    """A NeMo-RL-shaped config: flash requested on Megatron's local layer spec (what TE would run is
    read back after the first forward), vLLM with one split per KV when batch-invariant."""
    policy = policy_config("flash")
    if algorithm == "grpo":
        policy["generation"] = {
            "backend": "vllm",
            "colocated": {"enabled": False, "resources": {"num_nodes": 1, "gpus_per_node": vllm_workers}},
            "vllm_cfg": {"precision": "bfloat16", "env_vars": {"VLLM_BATCH_INVARIANT": "1"} if batch_invariant else {}},
            "vllm_kwargs": {},
        }
    cfg = {
        "cluster": {"num_nodes": 1, "gpus_per_node": policy_workers},
        "policy": policy,
        algorithm: {"max_num_steps": 2},
        "logger": {"log_dir": str(tmp_path / "logs")},
        "attention_align": {"report_dir": "${logger.log_dir}/attention_align", **align},  # as the README suggests
    }
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def driver_env(**env) -> dict[str, str]:
    """The shell's environment without the plugin's variables; this checkout and the stand-ins on
    ``PYTHONPATH`` (no shim, no launcher)."""
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("NEMO_RL_ATTN_ALIGN")}
    full_env.update(env, PYTHONPATH=os.pathsep.join([str(REPO), str(FAKE_NEMO_RL / "v0_6"), str(FAKE_VLLM)]))
    return full_env


def run_recipe(ray_cluster, tmp_path, config, algorithm="grpo", **env):
    """The recipe as its own driver process, started as a user starts it."""
    script = FAKE_NEMO_RL / "v0_6" / "examples" / f"run_{algorithm}.py"
    return subprocess.run(
        [sys.executable, str(script), "--config", str(config)],
        capture_output=True,
        text=True,
        env=driver_env(**env, RAY_ADDRESS=ray_cluster),
        cwd=tmp_path,
        timeout=300,
    )


def the_report(tmp_path):
    """The one report of the run: in exp_001, where NeMo-RL moved logger.log_dir."""
    assert not (tmp_path / "logs" / "attention_align").exists()  # not where ${logger.log_dir} pointed before the move
    return load_report(tmp_path / "logs" / "exp_001" / "attention_align" / REPORT_FILENAME)


def test_grpo_run_reports_once_and_the_read_back_reaches_the_report(ray_cluster, tmp_path):
    """The vLLM workers run in a venv without the plugin: their records arrive only if the driver
    hook exported the shim before the worker groups copied the driver's environment."""
    other_python = venv_without_plugin(tmp_path / "vllm-venv")
    out = run_recipe(
        ray_cluster,
        tmp_path,
        recipe_config(tmp_path),
        STANDIN_PY_EXECUTABLES=json.dumps({VLLM_WORKER: str(other_python)}),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rollout: 2 of 2 workers recorded" in out.stdout  # only the exported shim brings the plugin there
    assert "stand-in run_grpo: finished" in out.stdout
    assert out.stdout.count(SUMMARY) == 1  # the summary, once, by the driver
    assert f"{SUMMARY} INCOMPARABLE (on_mismatch: identity error, semantic warn; collected at setup)" in out.stdout
    assert out.stdout.count("attention_align (first_step): the report changed since setup:") == 1
    assert "verdict INCOMPARABLE -> FAIL" in out.stdout and "but the model ran local" in out.stdout
    assert out.stdout.count("attention_align (train_end): verdict fail, unchanged since first_step") == 1
    assert out.stdout.index(SUMMARY) < out.stdout.index("stand-in grpo_train: step 1 done")

    doc = the_report(tmp_path)
    assert doc["verdict"] == "fail" and [h["point"] for h in doc["history"]] == ["setup", "first_step", "train_end"]
    assert doc["workers"]["found"] == ["vllm-rank0-worker0", "vllm-rank1-worker0", "policy-rank0"]
    assert doc["workers"]["missing"] == [] and doc["workers"]["stale"] == []
    assert doc["workers"]["stages"] == {
        "training": {"policy-rank0": "first_forward"},
        "rollout": {"vllm-rank0-worker0": "engine_ready", "vllm-rank1-worker0": "engine_ready"},
    }
    merge = next(r for r in doc["binding"]["fields"] if r["field"] == "merge_rule")
    assert merge["training"]["value"] == "full_softmax" and merge["rollout"]["value"] == "online_softmax_lse"
    (finding,) = [f for f in doc["findings"] if f["code"] == Code.REPORT_WORKER_FINDING.value]
    assert finding["key"] == "workers.policy-rank0" and "requested AttnBackend.flash" in finding["message"]
    logged = [json.loads(line) for line in (tmp_path / "logs" / "exp_001" / "metrics.jsonl").read_text().splitlines()]
    drift = [
        {"step": e["step"], **{k: e["metrics"][k] for k in ("token_mult_prob_error", "gen_kl_error")}}
        for e in logged
        if "loss" in e["metrics"]
    ]
    assert doc["drift"]["steps"] == drift and len(drift) == 2 and drift[0]["token_mult_prob_error"] > 1.0


def test_on_mismatch_error_stops_the_run_at_setup_with_the_report_written(ray_cluster, tmp_path):
    config = recipe_config(tmp_path, vllm_workers=1, batch_invariant=False, on_mismatch="error")
    out = run_recipe(ray_cluster, tmp_path, config)
    assert out.returncode == 1 and "AttentionMismatch" in out.stderr and Code.ATTN_SEMANTIC_MANDATE.value in out.stderr
    assert "stand-in grpo_train" not in out.stdout  # stopped before any training step
    assert out.stdout.count(SUMMARY) == 1 and f"{SUMMARY} FAIL (on_mismatch: error; collected at setup)" in out.stdout
    doc = the_report(tmp_path)
    assert doc["verdict"] == "fail" and [h["point"] for h in doc["history"]] == ["setup"]
    reduction = next(r for r in doc["binding"]["fields"] if r["field"] == "reduction_order")
    assert reduction["rollout"]["value"] == "split_kv" and reduction["status"] == "mismatch"


def test_a_worker_that_died_in_setup_is_a_visible_gap(ray_cluster, tmp_path):
    report_dir = tmp_path / "logs" / "exp_001" / "attention_align"
    out = run_recipe(
        ray_cluster,
        tmp_path,
        recipe_config(tmp_path),
        STANDIN_DIE_RANKS="1",
        STANDIN_DIE_AFTER=str(report_dir / "hosts" / "rollout--vllm-rank0-worker0.json"),
    )  # rank 0 is up first
    assert out.returncode != 0 and "stand-in grpo_train" not in out.stdout
    assert "ActorDiedError" in out.stderr  # NeMo-RL's own error (the dead actor) propagates unchanged
    report_path = report_dir / REPORT_FILENAME
    assert (
        out.stdout.count(
            "attention_align (setup_failed): verdict incomparable; missing: vllm-rank1-worker0; "
            f"report written to {report_path}"
        )
        == 1
    )
    doc = the_report(tmp_path)
    assert doc["workers"]["found"] == ["vllm-rank0-worker0"] and doc["workers"]["missing"] == ["vllm-rank1-worker0"]
    assert Code.REPORT_WORKER_MISSING.value in {f["code"] for f in doc["findings"]}


def test_sft_run_states_that_there_is_no_rollout_side(ray_cluster, tmp_path):
    out = run_recipe(ray_cluster, tmp_path, recipe_config(tmp_path, algorithm="sft"), algorithm="sft")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count(SUMMARY) == 1 and "stand-in run_sft: finished" in out.stdout
    assert (
        "no rollout side: sft trains on a fixed dataset and starts no generation workers; "
        "the training/rollout binding is not applicable"
    ) in out.stdout
    doc = the_report(tmp_path)
    assert doc["binding"] is None and doc["binding_applicable"] is False and doc["verdict"] == "incomparable"
    assert doc["workers"]["stages"]["training"] == {"policy-rank0": "first_forward"}
    assert [c["side"] for c in doc["contracts"]] == ["training"]


def test_a_run_whose_vllm_workers_never_record_shows_0_of_n(ray_cluster, tmp_path):
    """The plugin switched off in the generation workers only (their env_vars): the driver knows from
    the config that 2 vLLM workers should have written, and says so."""
    path = recipe_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["policy"]["generation"]["vllm_cfg"]["env_vars"]["NEMO_RL_ATTN_ALIGN"] = "0"
    cfg["cluster"]["gpus_per_node"] = 3  # upstream: one node, 2 of its GPUs for generation (not colocated)
    path.write_text(yaml.safe_dump(cfg))
    out = run_recipe(ray_cluster, tmp_path, path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rollout: 0 of 2 workers recorded" in out.stdout
    doc = the_report(tmp_path)
    assert doc["workers"]["coverage"]["rollout"] == {
        "recorded": 0,
        "expected": 2,
        "how": doc["workers"]["coverage"]["rollout"]["how"],
    }
    assert doc["verdict"] == "incomparable" and doc["binding"] is None
    assert any(
        f["code"] == Code.REPORT_SIDE_MISSING.value and f["message"].startswith("rollout: 0 of 2")
        for f in doc["findings"]
    )
