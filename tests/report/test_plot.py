"""``report PATH --plot [OUT.png]``: NeMo-RL's mismatch metrics over the steps, the attention-only
estimate as a band, the verdict in the title; one PNG of a fixed size, written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.report.document import RunDescription, add_drift, collect, write_report
from nemo_rl_attn_align.report.report_plot import (
    BAND_LABEL,
    FRAMEWORK_THRESHOLD,
    NO_MATPLOTLIB,
    NO_STEPS,
    NOT_THIS_METRIC,
    NOTE_GID,
    PIXELS,
    PLOT_FILENAME,
    ZERO_LABEL,
    drift_figure,
)
from nemo_rl_attn_align.report.store import write_worker_record
from nemo_rl_attn_align.vocab.mandate import Mandate
from tests.conftest import REPO
from tests.contract_samples import MANDATE_OF_SAMPLES, full_contract

imread = pytest.importorskip("matplotlib.image").imread

MANDATE = Mandate(**MANDATE_OF_SAMPLES)
ESTIMATED = {
    "status": "estimated",
    "training_engine": "flash",
    "rollout_engine": "vllm-fa3",
    "dtype": "bf16",
    "figures": {
        "token_mult_prob_error": {"value": 1.002, "low": 1.001, "high": 1.003},
        "gen_kl_error": {"value": 2e-6, "low": 1e-6, "high": 4e-6},
    },
    "assumes": ["shape: 32 heads, 8 kv heads, head_dim 128"],
    "why": "an estimate from replays of the two engines' reduction orders on random inputs at this shape, not a bound",
}
ZERO = {**ESTIMATED, "status": "zero_by_construction", "figures": {}, "why": "both sides run the reference order"}
UNAVAILABLE = {**ESTIMATED, "status": "unavailable", "figures": {}, "why": "te-fused has no public reduction order"}


def _report_dir(path, *, steps=40, estimate=ESTIMATED, run_id="run-7", metrics=None, **rollout_changes):
    """A report written as the driver writes it: two worker records, collected, drift steps added."""
    for contract in (full_contract("training", "policy-0"), full_contract("rollout", "vllm-0", **rollout_changes)):
        write_worker_record(path, contract, probe({}, torch_module=False), run_id=run_id)
    doc = collect(path, AlignSettings(mandate=MANDATE), RunDescription(run_id))
    for step in range(1, steps + 1):
        wobble = 0.004 * ((step * 7) % 5) / 5
        figures = {
            "token_mult_prob_error": 1.02 + wobble + (0.04 if step == steps // 2 else 0.0),
            "gen_kl_error": 4e-4 + wobble / 10,
        }
        add_drift(doc, step, metrics(step) if metrics else figures)
    if estimate is not None:
        doc["drift"]["attention_only"] = estimate
    write_report(path, doc)
    return path


def _pixels(png):
    """The PNG decoded: (height, width, channels) floats in [0, 1]."""
    image = imread(png)
    assert image.dtype.kind == "f" and image.max() <= 1.0
    return image


def _non_white(image):
    return int((image[..., :3] < 0.9).any(axis=-1).sum())


def _band_pixels(image):
    """Pixels of the estimate band's colour (C2 at alpha 0.25 over white)."""
    target = (0.793, 0.907, 0.793)
    close = abs(image[..., 0] - target[0]) + abs(image[..., 1] - target[1]) + abs(image[..., 2] - target[2])
    return int((close < 0.03).sum())


def _note(fig):
    (note,) = [t for t in fig.texts if t.get_gid() == NOTE_GID]
    return note.get_text().replace("\n", " ")


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_plot_is_one_png_of_the_stated_size_with_the_band(tmp_path, capsys):
    report = _report_dir(tmp_path / "run")
    out = tmp_path / "drift.png"
    assert main(["report", str(report), "--plot", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("nemo-rl-attn-align report: verdict PASS") and lines[-1] == f"plot: {out}"
    image = _pixels(out)
    assert (image.shape[1], image.shape[0]) == PIXELS == (1000, 600)
    assert _non_white(image) > 5000  # panels, lines, text: not a blank canvas
    assert _band_pixels(image) > 2000  # the band spans the steps, not only its legend patch
    assert [p.name for p in out.parent.iterdir()] == [out.name, "run"]  # no temp file left


def test_without_an_estimate_there_is_no_band(tmp_path, capsys):
    out = tmp_path / "drift.png"
    assert main(["report", str(_report_dir(tmp_path / "run", estimate=None)), "--plot", str(out)]) == 0
    image = _pixels(out)
    assert (image.shape[1], image.shape[0]) == PIXELS and _non_white(image) > 5000
    assert _band_pixels(image) < 50
    fig = drift_figure(json.loads((tmp_path / "run" / "attention_align_report.json").read_text()))
    assert "no estimate in this report" in _note(fig)


def test_one_panel_per_metric_with_the_band_on_its_panel(tmp_path):
    doc = json.loads((_report_dir(tmp_path) / "attention_align_report.json").read_text())
    fig = drift_figure(doc)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["token_mult_prob_error", "gen_kl_error"]
    assert "verdict PASS, run run-7" in fig._suptitle.get_text()
    token, kl = panels
    assert BAND_LABEL in _legend(token) and BAND_LABEL in _legend(kl)
    assert any(str(FRAMEWORK_THRESHOLD) in label for label in _legend(token))  # the 1.05 line (data reach 1.06)
    assert not any(str(FRAMEWORK_THRESHOLD) in label for label in _legend(kl))
    (band,) = token.collections
    ys = band.get_paths()[0].vertices[:, 1]
    xs = band.get_paths()[0].vertices[:, 0]
    assert (ys.min(), ys.max()) == pytest.approx((1.001, 1.003)) and (xs.min(), xs.max()) == (1, 40)


def test_every_nemo_rl_metric_gets_a_panel_and_verl_metrics_do_not(tmp_path):
    def metrics(step):
        return {
            "token_mult_prob_error": 1.0 + step * 1e-4,
            "gen_kl_error": 1e-4,
            "policy_kl_error": 2e-4,
            "js_divergence_error": 5e-5,
            "rollout_probs_diff_max": 0.5,
        }

    doc = json.loads((_report_dir(tmp_path, metrics=metrics) / "attention_align_report.json").read_text())
    fig = drift_figure(doc)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error"]
    assert BAND_LABEL not in _legend(fig.axes[2])  # the estimate has no policy_kl figure
    assert NOT_THIS_METRIC in _legend(fig.axes[2]) and NOT_THIS_METRIC not in _legend(fig.axes[0])  # said so
    token = fig.axes[0]
    assert not any(FRAMEWORK_THRESHOLD in line.get_ydata() for line in token.lines)  # 1.004 is far below 1.05
    assert any("threshold: above this range" in label for label in _legend(token))  # said in the legend
    assert all(float(tick).is_integer() for tick in token.get_xticks())  # steps, not 1.5, 2.5


@pytest.mark.parametrize(
    "estimate,label,note",
    [
        (ZERO, ZERO_LABEL, "0 by construction (both sides run the reference order)"),
        (UNAVAILABLE, None, "not estimated (te-fused has no public reduction order)"),
    ],
)
def test_zero_by_construction_and_unavailable_render(tmp_path, capsys, estimate, label, note):
    report = _report_dir(tmp_path / "run", estimate=estimate)
    assert main(["report", str(report), "--plot"]) == 0
    image = _pixels(report / PLOT_FILENAME)  # the default OUT: beside the report
    assert (image.shape[1], image.shape[0]) == PIXELS and _non_white(image) > 5000
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {report / PLOT_FILENAME}"
    fig = drift_figure(json.loads((report / "attention_align_report.json").read_text()))
    legends = [text for ax in fig.axes if ax.get_visible() for text in _legend(ax)]
    assert BAND_LABEL not in legends
    assert (legends.count(ZERO_LABEL) == 2) if label else (ZERO_LABEL not in legends)
    assert note in _note(fig)
    if label:  # the zero line stands at each metric's no-drift value
        zero_lines = [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == ZERO_LABEL]
        assert sorted({float(line.get_ydata()[0]) for line in zero_lines}) == [0.0, 1.0]


def test_a_failing_run_plots_with_exit_1_and_the_verdict_in_the_title(tmp_path, capsys):
    report = _report_dir(tmp_path, dtype=FieldValue.observed("fp32"))
    out = tmp_path / "fail.png"
    assert main(["report", str(report / "attention_align_report.json"), "--plot", str(out)]) == 1
    assert out.is_file() and capsys.readouterr().out.splitlines()[-1] == f"plot: {out}"
    doc = json.loads((report / "attention_align_report.json").read_text())
    assert drift_figure(doc)._suptitle.get_text() == "attention_align drift: verdict FAIL, run run-7"


def test_json_keeps_stdout_json_and_says_plot_on_stderr(tmp_path, capsys):
    report = _report_dir(tmp_path)
    assert main(["report", str(report), "--json", "--plot"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "pass"
    assert captured.err == f"plot: {report / PLOT_FILENAME}\n"


def test_a_hostile_run_id_is_drawn_as_text(tmp_path, capsys):
    report = _report_dir(tmp_path, run_id="$\\frac{a}{$ \x1b[31m" + "x" * 500)
    assert main(["report", str(report), "--plot"]) == 0
    image = _pixels(report / PLOT_FILENAME)
    assert (image.shape[1], image.shape[0]) == PIXELS


def test_no_drift_steps_is_exit_2_with_one_line(tmp_path, capsys):
    report = _report_dir(tmp_path, steps=0)
    assert main(["report", str(report), "--plot"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {NO_STEPS}\n" and "drift: none recorded yet" in captured.out
    assert not (report / PLOT_FILENAME).exists()


def test_steps_without_nemo_rl_metrics_are_exit_2(tmp_path, capsys):
    report = _report_dir(tmp_path, steps=3, metrics=lambda step: {"rollout_probs_diff_max": 0.1})
    assert main(["report", str(report), "--plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "carry none of NeMo-RL's metrics" in err


def test_missing_matplotlib_is_exit_2_naming_the_extra(tmp_path, capsys, monkeypatch):
    report = _report_dir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(report), "--plot"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {NO_MATPLOTLIB}\n" and "pip install 'nemo-rl-attn-align[plot]'" in err
    assert not (report / PLOT_FILENAME).exists()


@pytest.mark.parametrize(
    "target",
    [
        lambda p: p / "no-such-dir" / "drift.png",
        lambda p: (p / "file.txt").write_text("x") and p / "file.txt" / "drift.png",
        lambda p: (p / "a-dir").mkdir() or p / "a-dir",  # a directory at OUT: the rename fails
    ],
)
def test_an_unwritable_output_is_exit_2_one_line_and_no_file(tmp_path, capsys, target):
    report = _report_dir(tmp_path / "run")
    out = target(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["report", str(report), "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: cannot write the plot: ") and err.count("\n") == 1
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # no temp file, no half-written PNG


def test_the_command_line_writes_the_plot_and_an_error_is_no_traceback(tmp_path):
    report = _report_dir(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "report", str(report), "--plot", str(tmp_path / "d.png")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == f"plot: {tmp_path / 'd.png'}"
    assert (tmp_path / "d.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    bad = subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "report", str(report), "--plot", str(tmp_path / "x" / "d.png")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
