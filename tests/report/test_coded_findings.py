"""A host detail's ``coded_findings``: findings a worker's hook made with their own code (e.g.
``PACKED_BOUNDARIES_DROPPED``), read back typed, kept as written in the report, an error of one
failing the verdict and the identity tier; anything else there makes the detail unreadable, naming the entry."""

from __future__ import annotations

import json

import pytest

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.report.document import collect
from nemo_rl_attn_align.report.finalize import failed_tiers
from nemo_rl_attn_align.report.store import (
    read_worker_files,
    worker_detail_path,
    write_worker_detail,
    write_worker_record,
)
from nemo_rl_attn_align.report.worker_files import HostDetail
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import finding
from nemo_rl_attn_align.vocab.mandate import Mandate
from tests.contract_samples import MANDATE_OF_SAMPLES, full_contract

SETTINGS = AlignSettings(mandate=Mandate(**MANDATE_OF_SAMPLES))
DROPPED = finding(
    Code.PACKED_BOUNDARIES_DROPPED,
    "workers.policy-0.decoder.layers.0.self_attention.core_attention",
    "1 of 3 sequences",
    "training worker policy-0: ... attended them as 1",
    "pass them",
)


def _pair(report_dir, coded=()):
    for side, worker_id in (("training", "policy-0"), ("rollout", "vllm-0")):
        write_worker_record(report_dir, full_contract(side, worker_id), probe({}, torch_module=False))
    detail = {"host": "megatron_worker", "stage": "first_forward", "findings": [], "peers": ["policy-0"]}
    write_worker_detail(report_dir, "training", "policy-0", {**detail, "coded_findings": list(coded)})


def test_a_coded_finding_reaches_the_report_as_written_and_an_error_fails_it(tmp_path):
    _pair(tmp_path / "clean")
    assert collect(tmp_path / "clean", SETTINGS)["verdict"] == "pass"
    _pair(tmp_path / "dropped", [DROPPED.to_dict()])
    [detail] = read_worker_files(tmp_path / "dropped").details.values()
    assert detail.coded_findings == (DROPPED,) and HostDetail.from_dict(detail.to_dict()) == detail
    doc = collect(tmp_path / "dropped", SETTINGS)
    assert doc["verdict"] == "fail" and failed_tiers(doc) == ["identity"]  # that side computes another function
    assert [f for f in doc["findings"] if f["code"] == Code.PACKED_BOUNDARIES_DROPPED.value] == [DROPPED.to_dict()]


@pytest.mark.parametrize(
    ("coded", "error"),
    [
        ({"code": "PACKED_BOUNDARIES_DROPPED"}, "host detail coded_findings is dict, not list or NoneType"),
        (["a line"], "host detail coded_findings[0] is not a finding"),
        ([{**DROPPED.to_dict(), "message": 3}], "host detail coded_findings[0] is not a finding"),
        ([DROPPED.to_dict(), {**DROPPED.to_dict(), "code": "NOT_A_CODE"}], "coded_findings[1]: unknown finding code"),
        ([{k: v for k, v in DROPPED.to_dict().items() if k != "value"}], "coded_findings[0]: 'value'"),
        ([{**DROPPED.to_dict(), "severity": "fatal"}], "coded_findings[0]: 'fatal' is not a valid Severity"),
    ],
)
def test_anything_else_there_makes_the_detail_unreadable_naming_the_entry(tmp_path, coded, error):
    _pair(tmp_path)
    path = worker_detail_path(tmp_path, "training", "policy-0")
    path.write_text(json.dumps({**json.loads(path.read_text()), "coded_findings": coded}))
    files = read_worker_files(tmp_path)
    [unreadable] = files.unreadable
    assert error in unreadable.error and files.details == {}
