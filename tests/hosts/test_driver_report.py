"""The driver's run report in-process: collection points, what is printed when, ``on_mismatch`` at
setup and at the first training step, gaps from the workers' peers, stale files, SFT, the report
dir following NeMo-RL's ``exp_NNN``, and our own failures never breaking the run.

Worker files are written with the real writers (``report.store.write_worker_record`` /
``write_worker_detail``) and the run id the real ``prepare()`` exported; the worker hooks that write
them in a real run are covered by test_megatron_worker / test_vllm_worker and end to end by
test_driver_end_to_end.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.hosts import driver_report, handoff, nemo_rl_driver
from nemo_rl_attn_align.report.document import REPORT_FILENAME
from nemo_rl_attn_align.report.finalize import AttentionMismatch
from nemo_rl_attn_align.report.load import load_report
from nemo_rl_attn_align.report.store import write_worker_detail, write_worker_record
from nemo_rl_attn_align.report.tracker_metrics import VERDICT_VALUES
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.worker_ids import rollout_peers, training_peers
from tests.contract_samples import full_contract
from tests.fake_nemo_rl.configs import policy_config
from tests.hosts.conftest import FAKE_NEMO_RL, standin


def config(tmp_path, *, rollout=True, **align):
    cfg = {
        "policy": {
            "precision": "bfloat16",
            "megatron_cfg": {
                "enabled": True,
                "attention_backend": "flash",
                "pipeline_dtype": "bfloat16",
                **{f"{kind}_model_parallel_size": 1 for kind in ("tensor", "pipeline")},
                "context_parallel_size": 1,
            },
        },
        "logger": {"log_dir": str(tmp_path / "logs" / "exp_001")},
        "attention_align": align,
    }
    if rollout:
        cfg["policy"]["generation"] = {"backend": "vllm", "vllm_cfg": {}}
    return cfg


@pytest.fixture
def driver(monkeypatch):
    """``prepare(cfg)`` as the setup() wrapper calls it; yields (run, printed lines)."""
    for name in (handoff.SETTINGS_ENV, handoff.REPORT_DIR_ENV, handoff.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    printed: list[str] = []

    def start(cfg, algorithm="grpo"):
        run = nemo_rl_driver.prepare(cfg, algorithm)
        run.printer = printed.append
        return run, printed

    yield start
    driver_report.stop()
    os.environ.pop(handoff.SETTINGS_ENV, None)


def worker(run, side, worker_id, peers, stage="engine_ready", findings=(), run_id=None, **changes):
    """One worker's two files, as its hook writes them."""
    run_id = run.run.run_id if run_id is None else run_id
    contract = full_contract(side, worker_id, **changes)
    write_worker_record(run.settings.report_dir, contract, probe({}, torch_module=False), run_id)
    write_worker_detail(
        run.settings.report_dir,
        side,
        worker_id,
        {"host": "test", "stage": stage, "findings": list(findings), "peers": peers},
        run_id,
    )


def report_of(run):
    return load_report(Path(run.settings.report_dir) / REPORT_FILENAME)


SPLIT_KV = {"reduction_order": FieldValue.configured("split_kv")}


def test_summary_once_at_setup_then_only_changes_then_one_line(driver, tmp_path):
    run, printed = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(1), stage="model_built")
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1), **SPLIT_KV)
    run.at_setup()
    assert len(printed) == 1 and printed[0].startswith(
        "nemo-rl-attn-align report: verdict FAIL (on_mismatch: identity error, semantic warn; collected at setup)"
    )
    assert "reduction_order" in printed[0] and "policy-rank0 [model_built]" in printed[0]

    driver_report.train_metrics({"mean_gen_tokens_per_sample": 12.0}, 1, "train")  # rollout metrics: no loss yet
    assert len(printed) == 1 and report_of(run)["collected_at"] == "setup"
    worker(
        run,
        "training",
        "policy-rank0",
        training_peers(1),
        stage="first_forward",
        findings=["attention_backend requested AttnBackend.flash (FlashAttention) but the model ran local"],
    )
    driver_report.train_metrics(
        {"loss": 0.5, "token_mult_prob_error": np.float32(1.0625), "gen_kl_error": 1e-4}, 1, "train"
    )
    assert len(printed) == 2 and printed[1].startswith("attention_align (first_step): the report changed since setup:")
    assert f"new: warning {Code.REPORT_WORKER_FINDING.value}" in printed[1] and "ran local" in printed[1]
    driver_report.train_metrics({"loss": 0.4, "token_mult_prob_error": 1.03125, "gen_kl_error": [0.1, 0.2]}, 2, "train")
    driver_report.train_metrics({"loss": 0.3, "token_mult_prob_error": 9.0}, 2, "validation")  # not a training step
    assert len(printed) == 2

    driver_report.end_of_training()
    driver_report._at_exit()  # the run already ended: nothing more
    assert (
        printed[2] == "attention_align (train_end): verdict fail, unchanged since first_step; "
        f"report: {run.settings.report_dir}/{REPORT_FILENAME}"
    )
    assert len(printed) == 3
    doc = report_of(run)
    assert doc["drift"]["steps"] == [
        {"step": 1, "token_mult_prob_error": 1.0625, "gen_kl_error": 1e-4},
        {"step": 2, "token_mult_prob_error": 1.03125},
    ]
    assert [h["point"] for h in doc["history"]] == ["setup", "first_step", "train_end"]
    assert doc["workers"]["stages"] == {
        "training": {"policy-rank0": "first_forward"},
        "rollout": {"vllm-rank0-worker0": "engine_ready"},
    }
    assert doc["run_id"] == run.run.run_id


def test_error_stops_at_setup_with_the_report_written(driver, tmp_path):
    run, printed = driver(config(tmp_path, on_mismatch="error"))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1), **SPLIT_KV)
    with pytest.raises(AttentionMismatch) as err:
        run.at_setup()
    assert [f.code for f in err.value.findings] == [Code.ATTN_SEMANTIC_MANDATE.value]
    assert report_of(run)["verdict"] == "fail" and len(printed) == 1 and "verdict FAIL" in printed[0]
    driver_report.end_of_training()  # the run stopped: no further collection, no second print
    assert len(printed) == 1 and [h["point"] for h in report_of(run)["history"]] == ["setup"]


def test_on_mismatch_comes_from_the_validated_settings_only(driver, tmp_path, monkeypatch):
    """No environment variable bypasses ``attention_align.on_mismatch``'s validation (a stray
    ``NEMO_RL_ATTN_ALIGN_ON_MISMATCH=Error`` once turned ``error`` into "never stop")."""
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_ON_MISMATCH", "Error")
    run, _ = driver(config(tmp_path, on_mismatch="error"))
    assert run.settings.on_mismatch.text() == "error"
    assert "on_mismatch" not in json.loads(os.environ[handoff.SETTINGS_ENV])  # the workers never act on it
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1), **SPLIT_KV)
    with pytest.raises(AttentionMismatch):
        run.at_setup()


def test_error_stops_at_the_first_step_when_the_read_back_fails_the_binding(driver, tmp_path):
    run, printed = driver(config(tmp_path, on_mismatch="error"))
    worker(run, "training", "policy-rank0", training_peers(1), stage="model_built")
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    run.at_setup()
    assert report_of(run)["verdict"] == "pass"
    worker(
        run,
        "training",
        "policy-rank0",
        training_peers(1),
        stage="first_forward",
        merge_rule=FieldValue.configured("full_softmax"),
    )  # TE ran unfused: one softmax over the row
    with pytest.raises(AttentionMismatch):
        driver_report.train_metrics({"loss": 1.0}, 1, "train")
    assert "verdict PASS -> FAIL" in printed[1] and report_of(run)["verdict"] == "fail"
    driver_report.train_metrics({"loss": 1.0, "gen_kl_error": 0.1}, 2, "train")
    assert report_of(run)["drift"]["steps"] == [] and len(printed) == 2


def test_record_prints_one_line_then_only_writes(driver, tmp_path):
    run, printed = driver(config(tmp_path, on_mismatch="record"))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1), **SPLIT_KV)
    run.at_setup()
    worker(run, "training", "policy-rank0", training_peers(1), stage="first_forward", findings=["NVTE differs"])
    driver_report.train_metrics({"loss": 1.0, "token_mult_prob_error": 1.5}, 1, "train")
    driver_report.end_of_training()
    assert printed == [
        f"attention_align (setup): verdict fail; report written to {run.settings.report_dir}/{REPORT_FILENAME}"
    ]
    doc = report_of(run)
    assert [h["point"] for h in doc["history"]] == ["setup", "first_step", "train_end"] and doc["drift"]["steps"][0][
        "step"
    ] == 1
    assert any(f["code"] == Code.REPORT_WORKER_FINDING.value for f in doc["findings"])


def test_a_worker_that_never_wrote_is_a_gap_named_by_its_peers(driver, tmp_path):
    run, printed = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(2))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(4, 2))  # TP 2: engines of actors 0 and 2
    run.at_setup()
    doc = report_of(run)
    assert doc["workers"]["missing"] == [
        "policy-rank1",
        "vllm-rank0-worker1",
        "vllm-rank2-worker0",
        "vllm-rank2-worker1",
    ]
    assert doc["verdict"] == "incomparable" and doc["binding"]["verdict"] == "pass"
    assert "missing: policy-rank1, vllm-rank0-worker1" in printed[0]


def test_files_of_another_run_in_the_same_dir_are_left_out(driver, tmp_path):
    run, _ = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    worker(
        run, "training", "policy-rank7", training_peers(8), run_id="an-earlier-run", num_layers=FieldValue.observed(99)
    )
    run.at_setup()
    doc = report_of(run)
    assert doc["verdict"] == "pass" and doc["workers"]["found"] == ["vllm-rank0-worker0", "policy-rank0"]
    assert len(doc["workers"]["stale"]) == 2 and all("policy-rank7" in p for p in doc["workers"]["stale"])


def test_sft_says_there_is_no_rollout_side(driver, tmp_path):
    run, printed = driver(config(tmp_path, rollout=False), "sft")
    worker(run, "training", "policy-rank0", training_peers(1), stage="first_forward")
    run.at_setup()
    doc = report_of(run)
    assert doc["binding"] is None and doc["binding_applicable"] is False and doc["verdict"] == "incomparable"
    codes = {f["code"] for f in doc["findings"]}
    assert Code.REPORT_SIDE_ABSENT.value in codes and Code.REPORT_SIDE_MISSING.value not in codes
    assert (
        "no rollout side: sft trains on a fixed dataset and starts no generation workers; "
        "the training/rollout binding is not applicable"
    ) in printed[0]


@pytest.mark.parametrize("drops", [False, True])
def test_packed_boundaries_dropped_at_the_first_step_fail_it(driver, hooked, tmp_path, monkeypatch, drops):
    """The stand-in worker hook in this process writes where the driver exported; the first packed
    micro-batch runs before the first step's metrics, as NeMo-RL's logprobs and training do."""
    monkeypatch.delenv(handoff.REPORT_DIR_ENV)  # ``hooked``'s: the driver's settings are the worker's
    run, printed = driver(config(tmp_path, rollout=False, on_mismatch="error"), "sft")
    policy = hooked("v0_6").MegatronPolicyWorker(policy_config("local", sequence_packing={"enabled": True}))
    monkeypatch.setattr(sys.modules["nemo_rl.models.megatron.train"], "DROPS_PACKED_SEQ_PARAMS", drops)
    run.at_setup()
    assert report_of(run)["verdict"] == "incomparable"
    policy.get_logprobs()
    if not drops:
        driver_report.train_metrics({"loss": 0.5}, 1, "train")
        assert len(printed) == 1 and report_of(run)["verdict"] == "incomparable"
        return
    with pytest.raises(AttentionMismatch, match=Code.PACKED_BOUNDARIES_DROPPED.value):
        driver_report.train_metrics({"loss": 0.5}, 1, "train")
    assert (
        "verdict INCOMPARABLE -> FAIL" in printed[1]
        and f"new: error {Code.PACKED_BOUNDARIES_DROPPED.value}" in printed[1]
    )
    doc = report_of(run)
    assert doc["collected_at"] == "first_step" and doc["verdict"] == "fail"
    [dropped] = [f for f in doc["findings"] if f["code"] == Code.PACKED_BOUNDARIES_DROPPED.value]
    assert dropped["key"] == "workers.policy-rank0.decoder.layers.0.self_attention.core_attention"


def test_grpo_without_vllm_names_the_config_key(driver, tmp_path):
    run, printed = driver(config(tmp_path, rollout=False))
    worker(run, "training", "policy-rank0", training_peers(1))
    run.at_setup()
    assert "no rollout side: policy.generation.backend is not set" in printed[0]


@pytest.mark.parametrize("backend", ["sglang", "dynamo"])
def test_an_unhooked_rollout_backend_is_one_warning_naming_its_gpus(driver, tmp_path, backend):
    cfg = config(tmp_path, rollout=False)
    cfg["policy"]["generation"] = {"backend": backend, "colocated": {"enabled": True}}
    cfg["cluster"] = {"num_nodes": 1, "gpus_per_node": 8}
    run, printed = driver(cfg)
    worker(run, "training", "policy-rank0", training_peers(1))
    run.at_setup()
    [line] = [line for line in printed[0].splitlines() if "REPORT_ROLLOUT_NOT_BOUND" in line]
    assert line.lstrip().startswith("warning")
    assert f"rollout side not bound: policy.generation.backend '{backend}'" in line
    assert "8 generation GPUs (cluster 1 x 8 GPUs, generation colocated) run unrecorded" in line


def test_strict_mode_stops_on_an_unhooked_rollout_backend(driver, tmp_path):
    cfg = config(tmp_path, rollout=False, strict=True)
    cfg["policy"]["generation"] = {"backend": "sglang"}
    run, _ = driver(cfg)
    worker(run, "training", "policy-rank0", training_peers(1))
    with pytest.raises(_patching.StrictModeError, match="rollout side not bound"):
        run.at_setup()


def test_megatron_generation_expects_one_engine_per_policy_worker(driver, tmp_path):
    cfg = config(tmp_path, rollout=False)
    cfg["policy"]["generation"] = {"backend": "megatron", "colocated": {"enabled": True}}
    cfg["cluster"] = {"num_nodes": 1, "gpus_per_node": 2}
    run, _ = driver(cfg)
    assert run.run.expected["rollout"].ids == ("megatron-gen-rank0", "megatron-gen-rank1")
    assert "rollout" not in run.run.absent_sides


@pytest.mark.parametrize(
    "report_dir,launcher,expected",
    [
        (None, None, "logs/exp_001/attention_align"),  # the default follows log_dir
        (
            "logs/attention_align",
            None,
            "logs/exp_001/attention_align",
        ),  # ${logger.log_dir}/... resolved before the move
        ("logs", None, "logs/exp_001"),
        ("logs/exp_000/attention_align", None, "logs/exp_000/attention_align"),  # another experiment's dir: kept
        ("elsewhere/align", None, "elsewhere/align"),  # outside the log dir: kept
        ("logs/attention_align", "from-the-launcher", "from-the-launcher"),  # nemo-rl-attn-align run --report-dir wins
    ],
)
def test_the_report_dir_follows_the_experiment_dir(driver, tmp_path, monkeypatch, report_dir, launcher, expected):
    monkeypatch.chdir(tmp_path)
    if launcher:
        monkeypatch.setenv(handoff.REPORT_DIR_ENV, launcher)
    cfg = config(tmp_path, **({"report_dir": report_dir} if report_dir else {}))
    cfg["logger"]["log_dir"] = "logs/exp_001"
    run, _ = driver(cfg)
    assert run.settings.report_dir == (launcher or str(tmp_path / expected))  # absolute: workers run elsewhere
    assert handoff.worker_settings().report_dir == run.settings.report_dir  # the workers write where the driver reads


def test_our_own_failure_is_a_warning_unless_strict(driver, tmp_path, caplog):
    run, printed = driver(config(tmp_path))
    Path(run.settings.report_dir).parent.mkdir(parents=True)
    Path(run.settings.report_dir).write_text("a file where the report dir should be")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        run.at_setup()
        driver_report.train_metrics({"loss": 1.0, "token_mult_prob_error": 1.0}, 1, "train")
        driver_report.end_of_training()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all("the run goes on" in w and run.settings.report_dir in w for w in warnings)
    assert printed == []
    strict, _ = driver(config(tmp_path, strict=True))
    with pytest.raises(OSError):
        strict.at_setup()
    strict.at_end("train_end")  # the end never raises, strict or not


def test_drift_figures_take_single_finite_numbers():
    torch = pytest.importorskip("torch")
    metrics = {
        "token_mult_prob_error": torch.tensor(1.25),
        "gen_kl_error": np.float64(2e-3),
        "policy_kl_error": float("nan"),
        "js_divergence_error": True,
        "loss": 0.1,
    }
    assert driver_report.drift_figures(metrics) == {"token_mult_prob_error": 1.25, "gen_kl_error": 2e-3}
    assert driver_report.drift_figures({"gen_kl_error": [1e-3, 2e-3], "token_mult_prob_error": "1.0"}) == {
        "token_mult_prob_error": 1.0
    }


def test_the_logger_seam_reaches_the_report(driver, tmp_path, bootstrap_state):
    run, _ = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    run.at_setup()
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    try:
        with standin(FAKE_NEMO_RL / "v0_6", "nemo_rl"):
            from nemo_rl.utils.logger import Logger  # imported through the bootstrap: wrapped

            logger = Logger({"log_dir": str(tmp_path / "logs" / "exp_001")})
            logger.log_metrics({"loss": 0.2, "token_mult_prob_error": 1.001}, 1, prefix="train")
            logger.log_metrics({"loss": 0.2, "gen_kl_error": 0.002}, 2, "train")  # prefix given positionally
    finally:
        nemo_rl_driver.detach()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "exp_001" / "metrics.jsonl").read_text().splitlines()]
    host = [(line["step"], line["prefix"], line["metrics"]) for line in lines if line["prefix"] != "attention_align"]
    assert host == [  # NeMo-RL's own logging is untouched
        (1, "train", {"loss": 0.2, "token_mult_prob_error": 1.001}),
        (2, "train", {"loss": 0.2, "gen_kl_error": 0.002}),
    ]
    ours = [line for line in lines if line["prefix"] == "attention_align"]
    assert [line["step"] for line in ours] == [1, 2]  # once per step, after the host's call, same step
    assert ours[0]["metrics"]["verdict"] == VERDICT_VALUES[report_of(run)["verdict"]]
    assert ours[0]["metrics"]["workers_recorded/training"] == 1.0
    assert report_of(run)["drift"]["steps"] == [
        {"step": 1, "token_mult_prob_error": 1.001},
        {"step": 2, "gen_kl_error": 0.002},
    ]


def test_temp_files_of_killed_writers_are_listed_then_removed_at_the_end(driver, tmp_path):
    """A writer killed between its temp file and the rename leaves ``.<name>.<rand>.tmp``: every
    collection lists it as an incomplete write and reads past it; the last one removes it."""
    import time

    run, _ = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    leftover = Path(run.settings.report_dir) / "workers" / ".rollout--vllm-rank0-worker1.json.k1ll3d.tmp"
    leftover.write_text('{"schema_version": 1, "kind": "nemo-rl-att')
    os.utime(leftover, (time.time() - 60, time.time() - 60))
    run.at_setup()
    assert (
        report_of(run)["workers"]["incomplete_writes"] == [str(leftover)]
        and report_of(run)["workers"]["unreadable"] == []
    )
    driver_report.end_of_training()
    assert not leftover.exists() and report_of(run)["workers"]["incomplete_writes"] == [str(leftover)]


def test_a_side_with_no_record_is_0_of_n_from_the_config(driver, tmp_path):
    """No vLLM worker wrote (e.g. a worker class the hook did not cover): the config says how many should have."""
    cfg = {**config(tmp_path), "cluster": {"num_nodes": 1, "gpus_per_node": 2}}
    run, printed = driver(cfg)
    worker(run, "training", "policy-rank0", training_peers(2))
    worker(run, "training", "policy-rank1", training_peers(2))
    run.at_setup()
    doc = report_of(run)
    assert (
        doc["workers"]["coverage"]["rollout"]["recorded"] == 0
        and doc["workers"]["coverage"]["rollout"]["expected"] == 2
    )
    assert "training: 2 of 2 workers recorded; rollout: 0 of 2 workers recorded" in printed[0]
    [missing] = [f for f in doc["findings"] if f["code"] == Code.REPORT_SIDE_MISSING.value]
    assert missing["severity"] == "warning" and missing["message"].startswith("rollout: 0 of 2 workers recorded")
    assert doc["workers"]["missing"] == ["vllm-rank0-worker0", "vllm-rank1-worker0"]
    assert doc["verdict"] == "incomparable"  # never an empty pass


def test_0_of_n_stops_a_strict_run_after_the_report_is_written(driver, tmp_path):
    from nemo_rl_attn_align.vocab.patching import StrictModeError

    cfg = {**config(tmp_path, strict=True), "cluster": {"num_nodes": 1, "gpus_per_node": 1}}
    run, _ = driver(cfg)
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    with pytest.raises(StrictModeError, match="training: 0 of 1 workers recorded"):
        run.at_setup()
    [missing] = [f for f in report_of(run)["findings"] if f["code"] == Code.REPORT_SIDE_MISSING.value]
    assert missing["severity"] == "error"


def test_tracker_gets_the_report_numbers_once_per_training_step(driver, tmp_path):
    run, _ = driver(config(tmp_path))
    worker(run, "training", "policy-rank0", training_peers(1))
    worker(run, "rollout", "vllm-rank0-worker0", rollout_peers(1, 1))
    run.at_setup()
    logged: list[tuple[int, dict]] = []
    for step in (1, 1, 2):  # NeMo-RL logs prefix="train" twice a step (rollout metrics, then the loss)
        driver_report.train_metrics(
            {"loss": 0.5, "gen_kl_error": 1e-3}, step, "train", lambda n, step=step: logged.append((step, n))
        )
    driver_report.train_metrics({"mean_reward": 1.0}, 3, "train", lambda n: logged.append((3, n)))  # no loss, no drift
    driver_report.train_metrics({"loss": 0.5}, 4, "validation", lambda n: logged.append((4, n)))
    assert [step for step, _ in logged] == [1, 2]
    numbers = logged[-1][1]
    doc = report_of(run)
    assert numbers["verdict"] == VERDICT_VALUES[doc["verdict"]]
    assert numbers["workers_recorded/rollout"] == 1.0 and numbers["readback_workers"] == 0.0
    assert numbers["fields_matching"] + numbers["fields_mismatching"] + numbers["fields_not_comparable"] == sum(
        f["tier"] != "recorded" for f in doc["binding"]["fields"]
    )
    assert doc["drift"]["attention_only"]["status"] in ("estimated", "zero_by_construction", "unavailable")
    assert doc["drift"]["attention_only"]["why"]


def test_tracker_off_by_key_and_its_failure_is_one_warning(driver, tmp_path, caplog):
    run, _ = driver(config(tmp_path, log_metrics=False, attention_estimate=False))
    run.at_setup()
    logged: list[dict] = []
    driver_report.train_metrics({"loss": 0.5}, 1, "train", logged.append)
    assert logged == [] and "attention_only" not in report_of(run)["drift"]
    driver_report.stop()

    run, _ = driver(config(tmp_path / "b"))
    run.at_setup()

    def broken(numbers):
        raise ConnectionError("wandb is down")

    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        driver_report.train_metrics({"loss": 0.5, "gen_kl_error": 0.5}, 1, "train", broken)
    assert any(
        "logging attention_align metrics" in r.getMessage() and "the run goes on" in r.getMessage()
        for r in caplog.records
    )
    assert report_of(run)["drift"]["steps"] == [{"step": 1, "gen_kl_error": 0.5}]  # the step itself was recorded


@pytest.mark.parametrize("config_json", ['{"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 1e8}', "{"])
def test_a_model_config_check_refuses_leaves_the_run_going(driver, tmp_path, config_json):
    """What ``check`` stops on (exit 2) stops no run: the driver reads the model as not usable, says
    why (here: why attention's share is not estimated), and goes on (issue #40)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config_json)
    cfg = config(tmp_path)
    cfg["policy"]["model_name"] = str(model)
    run, printed = driver(cfg)
    run.at_setup()
    assert report_of(run)["verdict"] == "incomparable"  # no worker recorded: the run went on to collect
    (summary,) = printed
    assert f"config.json {model / 'config.json'}" in summary
    assert ("num_hidden_layers=100000000.0 is a float" if "1e8" in config_json else "is not valid JSON") in summary
