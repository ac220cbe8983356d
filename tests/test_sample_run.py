"""The sample run report shipped in ``examples/sample-run/`` (``scripts/make_sample_run.py``): what real
engines recorded, collected by the driver's own code, readable by ``report`` and ``report --plot``
right after install, and small."""

from __future__ import annotations

import contextlib
import io

import pytest

from nemo_rl_attn_align.report.document import RunDescription, collect
from nemo_rl_attn_align.report.load import load_report

from .conftest import REPO

SAMPLE = REPO / "examples" / "sample-run" / "attention_align"
REPORT = SAMPLE / "attention_align_report.json"


@pytest.fixture(scope="module")
def doc() -> dict:
    return load_report(str(SAMPLE))


def test_the_sample_is_small():
    files = [p for p in SAMPLE.rglob("*") if p.is_file()]
    assert REPORT in files and sum(p.stat().st_size for p in files) < 1_000_000


def test_the_records_are_a_real_vllm_engine_and_a_real_megatron_core_model(doc):
    sides = {c["side"]: c for c in doc["contracts"]}
    assert set(sides) == {"training", "rollout"} and doc["workers"]["missing"] == []
    rollout, training = sides["rollout"]["fields"], sides["training"]["fields"]
    assert rollout["engine"]["value"] == "vllm" and rollout["backend"]["value"] == "CPU_ATTN"
    assert "vllm" in rollout["versions"]["value"]
    assert training["engine"]["value"] == "megatron-local"
    assert "megatron-core" in training["versions"]["value"]
    assert rollout["engine"]["provenance"] == training["engine"]["provenance"] == "observed"


def test_the_binding_is_what_the_report_code_makes_of_the_shipped_records(doc):
    from nemo_rl_attn_align.config.settings import load_settings

    settings = load_settings({"attention_align": {**doc["settings"], "report_dir": str(SAMPLE)}})
    again = collect(SAMPLE, settings, RunDescription(doc["run_id"], collective=None))
    assert again["binding"]["fields"] == doc["binding"]["fields"]
    assert again["verdict"] == doc["verdict"]


def test_each_step_carries_drift_the_engines_measured(doc):
    steps = doc["drift"]["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 3
    observed = [s["token_mult_prob_error"] for s in steps]
    assert all(1 < x < 1.05 for x in observed) and len(set(observed)) == len(observed)  # one batch per step


def _report(*args: str) -> tuple[int, str]:
    from nemo_rl_attn_align.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["report", *args])
    return code, out.getvalue()


def test_report_renders_the_sample_with_its_verdict(doc):
    code, printed = _report(str(SAMPLE))
    assert code == (1 if doc["verdict"] == "fail" else 0)
    assert f"verdict {doc['verdict'].upper()}" in printed


def test_report_plots_the_sample(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sample-run.png"
    _report(str(SAMPLE), "--plot", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
