"""The device script's pure parts on CPU: its comparison, record, sections at small sizes, usage."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.gpu import device_checks  # noqa: E402

SCRIPT = Path(__file__).with_name("run_device_checks.sh")


def test_agreement_counts_equal_elements_and_local_ulps():
    a = torch.tensor([[[1.0, 0.5, 0.25, 0.125]]], dtype=torch.bfloat16)
    b = a.clone()
    b[0, 0, 1] = 0.50390625  # one bf16 ulp at 0.5 = half an ulp at the row max 1.0
    got = device_checks.agreement(a, b, torch.bfloat16)
    assert got == {"equal_fraction": 0.75, "max_ulp": 0.5}


def test_record_keeps_finished_sections(tmp_path):
    record = device_checks.Record(tmp_path)
    record.section("one", {"rows": [1]})
    record.error("two", ImportError("No module named 'megatron'"))
    data = json.loads((tmp_path / "device-checks.json").read_text())
    assert data["sections"] == {"one": {"rows": [1]}} and "megatron" in data["errors"]["two"]


def test_sections_run_at_small_sizes_on_cpu():
    rows = device_checks.reference_invariance("cpu", quick=True)
    unequal = [r for r in rows if not r["equal"]]
    assert len(rows) > 20 and not unequal, f"{len(unequal)} of {len(rows)} plans differ: {unequal[:4]}"
    kernels = device_checks.fa2_vs_sdpa("cpu", quick=True)
    assert {(r["replay"], r["kernel"]) for r in kernels} == {
        (p, k) for p in device_checks.REPLAYS for k in device_checks.KERNELS
    }
    flash = [r for r in kernels if r["kernel"] == "FLASH_ATTENTION"]
    assert flash and all(0.0 <= r["equal_fraction"] <= 1.0 and r["max_ulp"] < 64 for r in flash)


def test_the_probe_section_runs_its_two_cases_on_cpu():
    rows = device_checks.probe("cpu")
    assert [(r["case"], r["first"], r["equal"]) for r in rows] == [
        ("aligned", None, True),
        ("softmax_scale", (0, "attention"), True),
    ]
    assert rows[1]["attention_share"][0] > 0 and rows[1]["replay_estimate"] == rows[1]["attention_share"]


def test_the_fingerprints_section_binds_both_sides_of_one_model_on_cpu():
    pytest.importorskip("megatron.core")
    aligned, window = device_checks.fingerprints("cpu")
    assert aligned["equal"] and window["equal"], (aligned["differences"], window["differences"])
    assert set(aligned["sides"]) == {"training", "rollout"} and aligned["same_on_cpu"] == {
        "training": True,
        "rollout": True,
    }
    assert {f: v["provenance"] for f, v in aligned["sides"]["rollout"].items()} == dict.fromkeys(
        ("rope", "mask", "softmax"), "observed"
    )
    assert all(d is None for d in aligned["differences"].values())
    mask = window["differences"]["mask"]
    assert (
        mask["layer"] == 0
        and "the training kernel sees every earlier token, the rollout kernel 8 tokens" in mask["message"]
    )
    assert window["differences"]["rope"] is None and window["differences"]["softmax"] is None


def test_main_records_each_section_and_fails_on_an_inequality(tmp_path, monkeypatch):
    """``main``'s loop with the sections stubbed: rows kept, a missing megatron-core recorded without
    failing, any other error or an unequal row failing the run (exit 1)."""
    monkeypatch.setattr(device_checks, "reference_invariance", lambda device, quick: [{"equal": True}])
    monkeypatch.setattr(device_checks, "fa2_vs_sdpa", lambda device, quick: [{"equal_fraction": 1.0}])
    monkeypatch.setattr(device_checks, "megatron_local", lambda device: (_ for _ in ()).throw(ImportError("megatron")))
    monkeypatch.setattr(device_checks, "probe", lambda device: [{"equal": True}])
    monkeypatch.setattr(device_checks, "fingerprints", lambda device: [{"case": "window", "equal": True}])
    assert device_checks.main([str(tmp_path), "--device", "cpu"]) == 0
    data = json.loads((tmp_path / "device-checks.json").read_text())
    assert set(data["sections"]) == {"reference_invariance", "fa2_vs_sdpa", "probe", "fingerprints"}
    assert data["sections"]["fingerprints"]["rows"] == [{"case": "window", "equal": True}]
    assert "megatron" in data["errors"]["megatron_local"] and data["environment"]["device"] == "cpu"
    monkeypatch.setattr(device_checks, "fingerprints", lambda device: [{"case": "window", "equal": False}])
    assert device_checks.main([str(tmp_path / "unequal"), "--device", "cpu"]) == 1
    monkeypatch.setattr(device_checks, "probe", lambda device: (_ for _ in ()).throw(RuntimeError("no CUDA")))
    assert device_checks.main([str(tmp_path / "error"), "--device", "cpu"]) == 1
    assert "no CUDA" in json.loads((tmp_path / "error" / "device-checks.json").read_text())["errors"]["probe"]


def test_script_needs_out_and_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    missing = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert missing.returncode == 2 and "usage" in missing.stderr
