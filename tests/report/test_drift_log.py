"""The drift log: appended one line per step, read back while the run goes on, torn lines skipped."""

from __future__ import annotations

import json
import subprocess
import sys

from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.report.document import (
    REPORT_FILENAME,
    RunDescription,
    collect,
    drift_entry,
    write_report,
)
from nemo_rl_attn_align.report.drift_log import append_step, drift_log_path, read_steps
from nemo_rl_attn_align.report.load import load_report


def test_steps_read_back_in_order_with_the_last_figures_of_a_repeated_step(tmp_path):
    log = drift_log_path(tmp_path, "abc")
    assert read_steps(log) is None  # no log yet
    append_step(log, drift_entry(2, {"token_mult_prob_error": 1.5}))
    append_step(log, drift_entry(1, {"gen_kl_error": 0.25}))
    append_step(log, drift_entry(2, {"token_mult_prob_error": 1.25}))
    assert log == tmp_path / "drift" / "abc.jsonl"
    assert read_steps(log) == [{"step": 1, "gen_kl_error": 0.25}, {"step": 2, "token_mult_prob_error": 1.25}]


def test_a_torn_last_line_and_foreign_lines_are_skipped(tmp_path):
    log = drift_log_path(tmp_path, "abc")
    append_step(log, drift_entry(1, {"gen_kl_error": 0.5}))
    with log.open("a") as handle:
        handle.write('"not a step"\n{"step": true}\n[1, 2]\n{"step": 3, "gen_kl_e')  # the last one is torn
    assert read_steps(log) == [{"step": 1, "gen_kl_error": 0.5}]
    append_step(log, drift_entry(4, {"gen_kl_error": 0.125}))  # after a torn line: on a line of its own
    assert read_steps(log) == [{"step": 1, "gen_kl_error": 0.5}, {"step": 4, "gen_kl_error": 0.125}]


def test_a_writer_killed_mid_run_leaves_every_complete_step(tmp_path):
    code = (
        "import os, sys\n"
        "from nemo_rl_attn_align.report.drift_log import append_step, drift_log_path\n"
        f"log = drift_log_path({str(tmp_path)!r}, 'r')\n"
        "for step in range(50): append_step(log, {'step': step, 'gen_kl_error': step / 8})\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 9
    assert [s["step"] for s in read_steps(drift_log_path(tmp_path, "r"))] == list(range(50))


def test_report_reads_the_log_while_the_run_goes_on(tmp_path):
    doc = collect(tmp_path, AlignSettings(), RunDescription("run1"))
    write_report(tmp_path, doc)  # the report as the setup collection wrote it: no steps
    for step in (1, 2, 3):
        append_step(drift_log_path(tmp_path, "run1"), drift_entry(step, {"token_mult_prob_error": 1 + step / 64}))
    append_step(drift_log_path(tmp_path, "other-run"), drift_entry(9, {"gen_kl_error": 1.0}))
    on_disk = json.loads((tmp_path / REPORT_FILENAME).read_text())
    assert on_disk["drift"]["steps"] == []  # a step does not rewrite the report
    loaded = load_report(tmp_path)
    assert [s["step"] for s in loaded["drift"]["steps"]] == [1, 2, 3]
    assert loaded["drift"]["steps"][2]["token_mult_prob_error"] == 1 + 3 / 64
