"""Report directory containment (issue #40, item 5): whatever the worker id, side or run id, and
however the report directory is spelled, the writers create nothing outside the report directory
(only the folders above it that it needs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.report.document import collect, write_report
from nemo_rl_attn_align.report.drift_log import append_step, drift_log_path, read_steps
from nemo_rl_attn_align.report.store import (
    claim_worker_id,
    read_worker_files,
    resolved,
    write_worker_detail,
    write_worker_record,
)
from tests.contract_samples import full_contract

PIECES = ["/", ".", "..", "\\", "\x00", "a", "X", "rd", "é", " ", "~", "-"]
ids = st.lists(st.sampled_from(PIECES), min_size=1).map("".join)
report_dirs = st.sampled_from(["rd", "X/rd/../rd2", "X/./a/../../rd3", "X/rd/../../Y/rd", "deep/er/../../rd4/."])


def _created(sandbox: Path) -> set[Path]:
    return {Path(root, name) for root, dirs, files in os.walk(sandbox) for name in (*dirs, *files)}


@settings(max_examples=60, deadline=None)
@given(worker_id=ids, side_text=ids, run_id=ids, spelled=report_dirs)
def test_nothing_is_created_outside_the_report_directory(worker_id, side_text, run_id, spelled):
    with tempfile.TemporaryDirectory() as folder:
        sandbox = Path(folder).resolve()
        report_dir = sandbox / spelled
        write_worker_record(report_dir, full_contract("training", worker_id), probe({}, torch_module=False), run_id)
        write_worker_detail(report_dir, side_text, worker_id, {"stage": "started"}, run_id)
        assert claim_worker_id(report_dir, side_text, worker_id, "writer").held
        append_step(drift_log_path(report_dir, run_id), {"step": 1})
        write_report(report_dir, collect(report_dir, AlignSettings()))

        home = resolved(report_dir)
        allowed_above = set(home.parents)
        outside = [p for p in _created(sandbox) if p != home and home not in p.parents and p not in allowed_above]
        assert outside == [], (spelled, worker_id, outside)
        files = read_worker_files(report_dir)
        assert [record.worker_id for record in files.records] == [worker_id]
        assert read_steps(drift_log_path(report_dir, run_id)) == [{"step": 1}]
