"""The run report: worker records written by many processes at once, collection with gaps and
corrupt files, the driver's verdict and enforcement, drift, and ``report PATH``."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.binding.profiles import PROFILES
from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.config.settings import AlignSettings, load_settings
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide
from nemo_rl_attn_align.report.document import (
    DRIFT_METRICS,
    REPORT_FILENAME,
    RunDescription,
    add_drift,
    collect,
    write_report,
)
from nemo_rl_attn_align.report.finalize import AttentionMismatch, Collection, finalize
from nemo_rl_attn_align.report.load import ReportError, load_report
from nemo_rl_attn_align.report.report_render import render_changes, render_summary
from nemo_rl_attn_align.report.store import (
    atomic_write_json,
    read_worker_files,
    worker_detail_path,
    worker_record_path,
    write_worker_detail,
    write_worker_record,
)
from nemo_rl_attn_align.vocab.codes import Code, Kind, codes_of
from nemo_rl_attn_align.vocab.mandate import Mandate
from tests.contract_samples import MANDATE_OF_SAMPLES, full_contract

MANDATE = Mandate(**MANDATE_OF_SAMPLES)
SETTINGS = AlignSettings(mandate=MANDATE)


def expecting(*worker_ids: str) -> RunDescription:
    """A run that expects these workers (``policy-*``: training, ``vllm-*``: rollout), no count."""
    sides = {"training": "policy-", "rollout": "vllm-"}
    return RunDescription(
        expected={
            side: ExpectedSide(None, tuple(w for w in worker_ids if w.startswith(p)), "test")
            for side, p in sides.items()
        }
    )


DOCS = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"
_CTX = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def _write_pair(report_dir, **rollout_changes):
    write_worker_record(report_dir, full_contract("training", "policy-0"), probe({}, torch_module=False))
    write_worker_record(
        report_dir, full_contract("rollout", "vllm-0", **rollout_changes), probe({}, torch_module=False)
    )


def test_records_collect_into_one_report(tmp_path):
    _write_pair(tmp_path)
    doc = collect(tmp_path, SETTINGS, expecting("policy-0", "vllm-0"))
    assert doc["verdict"] == "pass" and doc["workers"]["missing"] == [] and doc["workers"]["unreadable"] == []
    assert [(c["side"], c["worker_id"]) for c in doc["contracts"]] == [("rollout", "vllm-0"), ("training", "policy-0")]
    assert doc["binding"]["training_worker"] == "policy-0" and doc["binding"]["rollout_worker"] == "vllm-0"
    assert set(doc["drift"]["metrics"]) == set(DRIFT_METRICS) and doc["drift"]["steps"] == []
    json.dumps(doc, allow_nan=False)
    assert not list((tmp_path / "workers").glob(".*.tmp"))


def test_worker_ids_become_safe_file_names(tmp_path):
    path = write_worker_record(tmp_path, full_contract("rollout", "vllm dp0/tp1"))
    assert path == worker_record_path(tmp_path, "rollout", "vllm dp0/tp1") and path.name == "rollout--vllm_dp0_tp1.json"
    assert read_worker_files(tmp_path).records[0].worker_id == "vllm dp0/tp1"


def test_the_report_says_why_a_binding_fails(tmp_path):
    _write_pair(tmp_path, reduction_order=FieldValue.configured("split_kv", "vLLM decode split-KV"))
    doc = collect(tmp_path, SETTINGS)
    assert doc["verdict"] == "fail"
    (error,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert error["code"] == Code.ATTN_SEMANTIC_MANDATE.value and "split_kv" in error["message"]
    text = render_summary(doc)
    assert "verdict FAIL" in text and re.search(r"reduction_order\s+semantic\s+MISMATCH", text)
    assert "drift: none recorded yet" in text


# --- many writers at once ----------------------------------------------------------------------


def _writer(report_dir: str, side: str, worker_id: str, rounds: int) -> None:
    for i in range(rounds):
        contract = full_contract(side, worker_id, physical_batch=FieldValue.observed(i + 1))
        write_worker_record(report_dir, contract, probe({"NCCL_ALGO": "Ring"}, torch_module=False))


def _report_writer(report_dir: str, rounds: int) -> None:
    for i in range(rounds):
        doc = collect(report_dir, SETTINGS)
        doc["drift"]["steps"] = [{"step": i, "token_mult_prob_error": 1.0}]
        write_report(report_dir, doc)


def test_many_processes_write_at_once_and_every_read_is_whole(tmp_path):
    workers = [("training", f"policy-{i}") for i in range(4)] + [("rollout", f"vllm-{i}") for i in range(4)]
    procs = [_CTX.Process(target=_writer, args=(str(tmp_path), side, wid, 15)) for side, wid in workers]
    procs += [_CTX.Process(target=_report_writer, args=(str(tmp_path), 6)) for _ in range(2)]
    for p in procs:
        p.start()
    reads = 0
    while any(p.is_alive() for p in procs) or reads < 3:
        files = read_worker_files(tmp_path)
        assert files.unreadable == (), files.unreadable
        if (tmp_path / REPORT_FILENAME).exists():
            load_report(tmp_path)  # never a half-written report either
        reads += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    doc = collect(tmp_path, SETTINGS, expecting(*(wid for _, wid in workers)))
    assert (
        doc["workers"]["missing"] == []
        and doc["workers"]["unreadable"] == []
        and doc["workers"]["incomplete_writes"] == []
    )
    assert sorted(doc["workers"]["found"]) == sorted(wid for _, wid in workers)
    assert all(c["fields"]["physical_batch"]["value"] == 15 for c in doc["contracts"])  # each worker's last write won
    assert doc["verdict"] == "pass"


def _die_mid_write(report_dir: str) -> None:
    os.replace = lambda *a: os._exit(3)  # the process dies between writing the temp file and the rename
    write_worker_record(report_dir, full_contract("rollout", "vllm-1"))


def test_a_worker_that_died_leaves_a_gap_not_a_corrupt_file(tmp_path):
    _write_pair(tmp_path)
    p = _CTX.Process(target=_die_mid_write, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == 3
    doc = collect(tmp_path, SETTINGS, expecting("policy-0", "vllm-0", "vllm-1"))
    assert doc["workers"]["missing"] == ["vllm-1"]
    assert doc["workers"]["unreadable"] == [] and len(doc["workers"]["incomplete_writes"]) == 1
    assert doc["verdict"] == "incomparable"  # the two that wrote agree, but not every worker was seen
    assert Code.REPORT_WORKER_MISSING.value in {f["code"] for f in doc["findings"]}
    assert "missing: vllm-1" in render_summary(doc)


@pytest.mark.parametrize(
    "content",
    [
        '{"kind": "nemo-rl-attn-align/worker", "schema_ver',
        "",
        "[]",
        '{"kind": "other"}',
        '{"kind": "nemo-rl-attn-align/worker", "schema_version": 99}',
    ],
)
def test_a_corrupt_or_foreign_record_is_reported_not_fatal(tmp_path, content):
    _write_pair(tmp_path)
    (tmp_path / "workers" / "rollout--vllm-9.json").write_text(content)
    doc = collect(tmp_path, SETTINGS)
    (bad,) = doc["workers"]["unreadable"]
    assert bad["path"].endswith("rollout--vllm-9.json") and bad["error"]
    assert doc["verdict"] == "incomparable" and doc["binding"]["verdict"] == "pass"


def test_a_worker_that_disagrees_with_its_side_fails_the_report(tmp_path):
    _write_pair(tmp_path)
    write_worker_record(tmp_path, full_contract("training", "policy-1", num_layers=FieldValue.observed(27)))
    doc = collect(tmp_path, SETTINGS)
    assert doc["verdict"] == "fail" and doc["binding"]["verdict"] == "pass"
    (f,) = [f for f in doc["findings"] if f["code"] == Code.REPORT_WORKER_DIVERGES.value]
    assert "policy-1" in f["message"] and f["key"] == "contract.identity.num_layers"


def test_a_side_without_records_cannot_be_bound(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "policy-0"))
    doc = collect(tmp_path, SETTINGS)
    assert doc["binding"] is None and doc["verdict"] == "incomparable"
    assert Code.REPORT_SIDE_MISSING.value in {f["code"] for f in doc["findings"]}
    assert "verdict INCOMPARABLE" in render_summary(doc)


def test_determinism_probes_join_the_binding(tmp_path):
    t = full_contract("training", "policy-0", tp_size=FieldValue.observed(2))
    r = full_contract("rollout", "vllm-0", tp_size=FieldValue.observed(2))
    write_worker_record(tmp_path, t, probe(PROFILES["megatron-deterministic"].apply({})[0], torch_module=False))
    write_worker_record(tmp_path, r, probe(PROFILES["vllm-batch-invariant"].apply({})[0], torch_module=False))
    doc = collect(tmp_path, SETTINGS)  # collective auto: tp_size 2 -> allreduce
    det = doc["binding"]["determinism"]
    assert det["collective"] == "allreduce" and det["blocking"] and doc["verdict"] == "fail"
    assert "NCCL_ALGO" in render_summary(doc)
    doc_tp1 = collect(tmp_path, SETTINGS, RunDescription(collective=None))
    assert doc_tp1["verdict"] == "pass" and doc_tp1["binding"]["determinism"]["collective"] is None


# --- the driver ---------------------------------------------------------------------------------


def _settings(tmp_path, on_mismatch):
    return load_settings(
        {
            "policy": {"precision": "bfloat16"},
            "logger": {"log_dir": str(tmp_path)},
            "attention_align": {"on_mismatch": on_mismatch},
        }
    )


@pytest.mark.parametrize("on_mismatch", ["error", "warn", "record"])
def test_finalize_writes_prints_once_and_enforces(tmp_path, on_mismatch):
    settings = _settings(tmp_path, on_mismatch)
    _write_pair(settings.report_dir, reduction_order=FieldValue.configured("split_kv"))
    printed = []
    if on_mismatch == "error":
        with pytest.raises(AttentionMismatch) as err:
            finalize(settings, printer=printed.append)
        assert [f.code for f in err.value.findings] == [Code.ATTN_SEMANTIC_MANDATE.value]
    else:
        assert finalize(settings, printer=printed.append)["verdict"] == "fail"
    assert len(printed) == 1  # the summary is printed once
    assert load_report(settings.report_dir)["verdict"] == "fail"  # written before enforcing
    if on_mismatch == "record":
        assert printed[0].count("\n") == 0 and "verdict fail" in printed[0]
    else:
        assert "reduction_order" in printed[0] and REPORT_FILENAME in printed[0]


def test_finalize_passes_quietly_through_a_passing_run_with_error(tmp_path):
    settings = _settings(tmp_path, "error")
    _write_pair(settings.report_dir)
    assert finalize(settings, expecting("policy-0", "vllm-0"), printer=lambda _: None)["verdict"] == "pass"


# --- drift ---------------------------------------------------------------------------------------


def test_drift_is_recorded_under_both_frameworks_names(tmp_path):
    _write_pair(tmp_path)
    doc = collect(tmp_path, SETTINGS)
    add_drift(doc, 2, {"token_mult_prob_error": 1.0004, "gen_kl_error": 1e-4})
    add_drift(doc, 1, {"training/rollout_probs_diff_max": 0.61, "rollout_probs_diff_mean": 0.002})
    add_drift(doc, 2, {"token_mult_prob_error": 1.0, "rollout_probs_diff_std": 0.0})  # replaces step 2
    write_report(tmp_path, doc)  # as the driver does after each step
    assert doc["drift"]["steps"] == [
        {"step": 1, "rollout_probs_diff_max": 0.61, "rollout_probs_diff_mean": 0.002},
        {"step": 2, "token_mult_prob_error": 1.0, "rollout_probs_diff_std": 0.0},
    ]
    assert load_report(tmp_path) == doc
    assert "drift at step 2 (2 steps recorded)" in render_summary(doc)
    before = json.loads(json.dumps(doc))
    for bad in ({"token_mult_prob_err": 1.0}, {"gen_kl_error": float("nan")}, {"gen_kl_error": "0.1"}):
        with pytest.raises(ValueError):
            add_drift(doc, 3, bad)
    with pytest.raises(ValueError):
        add_drift(doc, -1, {})
    assert doc == before  # the refused calls left the document untouched


def test_the_schema_names_only_report_functions_that_exist():
    """The docs name the one way drift is recorded (``add_drift`` + ``write_report``), and every
    ``report.<name>`` they mention is in the module."""
    import nemo_rl_attn_align.report.document as report

    named = set(re.findall(r"`report\.(\w+)`", DOCS.read_text()))
    assert {"add_drift", "write_report"} <= named
    assert [name for name in sorted(named) if not hasattr(report, name)] == []


# --- reading, and `report PATH` ------------------------------------------------------------------


def test_load_report_from_a_directory_with_only_worker_records(tmp_path):
    _write_pair(tmp_path)
    doc = load_report(tmp_path)
    assert doc["collected_from_workers"] is True and doc["settings"]["mandate"] == Mandate().to_dict()
    assert "collected from worker records" in render_summary(doc)


@pytest.mark.parametrize(
    "setup,match",
    [
        (lambda p: p / "nope.json", "cannot read"),
        (lambda p: p, "no attention_align_report.json and no workers/"),
        (lambda p: (p / "r.json").write_text("{bad") and p / "r.json", r"not valid JSON \(line 1"),
        (lambda p: (p / "r.json").write_text("[]") and p / "r.json", "not a nemo-rl-attn-align report"),
        (
            lambda p: atomic_write_json(p / "r.json", {"kind": "nemo-rl-attn-align/report", "schema_version": 7}),
            "schema_version 7",
        ),
        (
            lambda p: atomic_write_json(p / "r.json", {"kind": "nemo-rl-attn-align/report", "schema_version": 1}),
            "report lacks",
        ),
    ],
)
def test_unreadable_reports_raise_one_line(tmp_path, setup, match):
    with pytest.raises(ReportError, match=match) as err:
        load_report(setup(tmp_path))
    assert "\n" not in str(err.value)


def _report_file(tmp_path, **rollout_changes):
    _write_pair(tmp_path, **rollout_changes)
    return write_report(tmp_path, collect(tmp_path, SETTINGS))


def test_report_command_exit_codes(tmp_path, capsys):
    passing = _report_file(tmp_path / "ok")
    assert main(["report", str(passing)]) == 0
    out = capsys.readouterr().out
    assert (
        "verdict PASS" in out and "match on both sides (49)" in out and not re.search(r"architecture\s+identity", out)
    )
    assert main(["report", "--all", str(passing)]) == 0
    assert re.search(r"architecture\s+identity\s+match\s+Qwen2ForCausalLM \[obs\]", capsys.readouterr().out)
    failing = _report_file(tmp_path / "bad", dtype=FieldValue.observed("fp32"))
    assert main(["report", str(failing.parent)]) == 1
    assert "dtype" in capsys.readouterr().out
    assert main(["report", "--json", str(failing)]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "fail"
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    broken = tmp_path / "broken.json"
    doc = json.loads(passing.read_text())
    del doc["binding"]["fields"]
    broken.write_text(json.dumps(doc))
    assert main(["report", str(broken)]) == 2
    assert "malformed" in capsys.readouterr().err


def test_report_command_in_a_real_subprocess(tmp_path):
    path = _report_file(tmp_path, split_kv_policy=FieldValue.observed("heuristic"))
    out = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "report", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"split_kv_policy\s+recorded\s+different", out.stdout)
    bad = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "report", str(tmp_path / "x.json")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_the_schema_doc_covers_every_top_level_key(tmp_path):
    _write_pair(tmp_path)
    doc = load_report(tmp_path)
    text = DOCS.read_text()
    for key in list(doc) + list(doc["workers"]) + list(doc["binding"]) + list(doc["binding"]["determinism"]):
        assert f"`{key}`" in text, key
    for code in codes_of(Kind.BINDING, Kind.DETERMINISM, Kind.REPORT, Kind.PRESET):
        assert f"| `{code.value}` | {code.severity_text} | {code.summary} |" in text, code


def test_every_report_finding_has_the_severity_its_code_registers(tmp_path):
    _write_pair(tmp_path)
    write_worker_record(tmp_path, full_contract("training", "policy-1", num_layers=FieldValue.observed(27)))
    write_worker_detail(
        tmp_path,
        "training",
        "policy-0",
        {
            "host": "megatron_worker",
            "stage": "first_forward",
            "findings": ["TE ran FusedAttention"],
            "peers": ["policy-0"],
        },
    )
    (tmp_path / "workers" / "rollout--vllm-9.json").write_text("[]")
    doc = collect(tmp_path, SETTINGS, expecting("policy-0", "policy-7"))
    seen = set()
    for f in doc["findings"]:
        code = Code(f["code"])
        seen.add(code)
        assert not code.varies and f["severity"] == code.severity.value, f
    assert {
        Code.REPORT_WORKER_DIVERGES,
        Code.REPORT_WORKER_FINDING,
        Code.REPORT_WORKER_MISSING,
        Code.REPORT_RECORD_UNREADABLE,
    } <= seen
    # the one report code whose severity varies: warning, an error in strict mode with a known count
    write_worker_record(tmp_path / "alone", full_contract("training", "policy-0"))
    for strict, severity in ((False, "warning"), (True, "error")):
        doc = collect(
            tmp_path / "alone",
            SETTINGS.replace(strict=strict),
            RunDescription(expected={"rollout": ExpectedSide(2, (), "cfg")}),
        )
        (f,) = [f for f in doc["findings"] if f["code"] == Code.REPORT_SIDE_MISSING.value]
        assert Code.REPORT_SIDE_MISSING.varies and f["severity"] == severity
        assert f["severity"] in Code.REPORT_SIDE_MISSING.severity_text


# --- host details, later collections, other runs -------------------------------------------------


def test_host_details_give_stages_findings_and_the_peers_that_never_wrote(tmp_path):
    _write_pair(tmp_path)
    write_worker_detail(
        tmp_path,
        "training",
        "policy-0",
        {
            "host": "megatron_worker",
            "stage": "first_forward",
            "findings": ["TE ran FusedAttention"],
            "peers": ["policy-0", "policy-1"],
        },
    )
    write_worker_detail(
        tmp_path,
        "rollout",
        "vllm-0",
        {"host": "vllm_worker", "stage": "engine_ready", "findings": [], "peers": ["vllm-0"]},
    )
    worker_detail_path(tmp_path, "rollout", "vllm-9").write_text(
        '{"kind": "nemo-rl-attn-align/host-detail"}'
    )  # no side
    (tmp_path / "hosts" / ".rollout--vllm-8.json.abc.tmp").write_text("{")  # a writer died mid-write
    doc = collect(tmp_path, SETTINGS)
    assert doc["workers"]["missing"] == ["policy-1"] and doc["verdict"] == "incomparable"
    assert doc["workers"]["stages"] == {
        "training": {"policy-0": "first_forward"},
        "rollout": {"vllm-0": "engine_ready"},
    }
    assert [u["path"].endswith("rollout--vllm-9.json") for u in doc["workers"]["unreadable"]] == [True]
    assert doc["workers"]["incomplete_writes"][0].endswith(".tmp")
    (finding,) = [f for f in doc["findings"] if f["code"] == Code.REPORT_WORKER_FINDING.value]
    assert finding == {
        "code": "REPORT_WORKER_FINDING",
        "severity": "warning",
        "key": "workers.policy-0",
        "value": "first_forward",
        "message": "training worker policy-0 (megatron_worker): TE ran FusedAttention",
        "fix": "see hosts/training--policy-0.json for what the hook saw; "
        "attention_align.strict: true stops the run on such a finding",
    }
    assert "training policy-0 [first_forward]" in render_summary(doc)


def test_files_of_another_run_are_stale_not_collected(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "policy-0"), run_id="now")
    write_worker_record(tmp_path, full_contract("rollout", "vllm-0"), run_id="now")
    write_worker_record(
        tmp_path, full_contract("training", "policy-1", num_layers=FieldValue.observed(3)), run_id="before"
    )
    assert collect(tmp_path, SETTINGS)["verdict"] == "fail"  # all files: policy-1 diverges
    doc = collect(tmp_path, SETTINGS, RunDescription("now"))
    assert (
        doc["verdict"] == "pass"
        and doc["run_id"] == "now"
        and doc["workers"]["stale"][0].endswith("training--policy-1.json")
    )
    assert "stale files of other runs: 1" in render_summary(doc)


def test_a_side_absent_by_design_is_stated_not_missing(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "policy-0"))
    doc = collect(tmp_path, SETTINGS, RunDescription(absent_sides={"rollout": "sft starts no generation workers"}))
    assert doc["binding_applicable"] is False and doc["binding"] is None and doc["verdict"] == "incomparable"
    assert [f["code"] for f in doc["findings"]] == [Code.REPORT_SIDE_ABSENT.value]
    assert (
        "no rollout side: sft starts no generation workers; the training/rollout binding is not applicable"
        in render_summary(doc)
    )
    _write_pair(tmp_path)  # a rollout record after all: it is bound
    assert collect(tmp_path, SETTINGS, RunDescription(absent_sides={"rollout": "x"}))["binding_applicable"] is True


def test_a_later_collection_keeps_drift_and_says_only_what_changed(tmp_path):
    settings = _settings(tmp_path, "warn")
    _write_pair(settings.report_dir)
    printed = []
    first = finalize(settings, printer=printed.append)
    first = add_drift(first, 1, {"gen_kl_error": 0.5})
    same = finalize(settings, at=Collection("first_step", previous=first), printer=printed.append)
    assert render_changes(first, same) == [] and len(printed) == 1  # nothing changed: nothing printed
    write_worker_record(settings.report_dir, full_contract("rollout", "vllm-0", dtype=FieldValue.observed("fp16")))
    later = finalize(settings, at=Collection("train_end", previous=same, final=True), printer=printed.append)
    assert later["drift"]["steps"] == [{"step": 1, "gen_kl_error": 0.5}]
    assert [h["point"] for h in later["history"]] == ["setup", "first_step", "train_end"]
    assert printed[1].splitlines()[:2] == [
        "attention_align (train_end): the report changed since first_step:",
        "  verdict PASS -> FAIL",
    ]
    assert any(line.startswith("  new: error ATTN_SEMANTIC_MANDATE") for line in printed[1].splitlines())
    assert printed[1].endswith(f"report updated: {settings.report_dir}/{REPORT_FILENAME}") and len(printed) == 2


def test_the_same_worker_id_on_both_sides_keeps_both_records(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "w0"), probe({"NCCL_ALGO": "Ring"}, torch_module=False))
    write_worker_record(tmp_path, full_contract("rollout", "w0"), probe({"NCCL_ALGO": "Tree"}, torch_module=False))
    doc = collect(tmp_path, SETTINGS, RunDescription(collective="allreduce"))
    probes = doc["determinism_probes"]
    assert (
        probes["training"]["w0"]["env"]["NCCL_ALGO"] == "Ring" and probes["rollout"]["w0"]["env"]["NCCL_ALGO"] == "Tree"
    )
    assert doc["binding"]["determinism"]["blocking"] and doc["verdict"] == "fail"
