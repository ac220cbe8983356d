"""The ``gpu`` each worker records (``hosts.worker_records``) and the in-run estimate on the GPU the workers record."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.contract.contract import AttentionContract, FieldValue
from nemo_rl_attn_align.hosts import driver_report, nemo_rl_driver, worker_records
from nemo_rl_attn_align.report.store import write_worker_record
from nemo_rl_attn_align.vocab.schema import Provenance
from tests.contract_samples import full_contract


def _cuda(monkeypatch, *, available=True, initialized=True, capability=(9, 0)):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")


def _unset(contract):
    return AttentionContract(
        contract.side, contract.worker_id, {**contract.fields, "gpu": FieldValue.pending("known at runtime")}
    )


def test_a_cpu_worker_records_that_it_has_no_gpu():
    gpu = worker_records.device_gpu()  # this machine has no CUDA device
    assert (gpu.value, gpu.provenance) == (None, Provenance.OBSERVED) and "no CUDA device" in gpu.source


@pytest.mark.parametrize(
    "cuda, value, provenance",
    [
        ({}, "sm90", Provenance.OBSERVED),
        ({"capability": (10, 3)}, "sm103", Provenance.OBSERVED),
        ({"capability": (7, 5)}, "sm75", Provenance.OBSERVED),  # a GPU the tables do not know keeps its name
        ({"initialized": False}, None, Provenance.UNOBSERVABLE),  # recording never initializes CUDA
    ],
)
def test_the_gpu_comes_from_torch_cuda_where_cuda_is_initialized(monkeypatch, cuda, value, provenance):
    _cuda(monkeypatch, **cuda)
    contract = worker_records.with_device(_unset(full_contract("training")))
    assert (contract["gpu"].value, contract["gpu"].provenance) == (value, provenance)
    if value == "sm90":
        assert contract["gpu"].source == "torch.cuda.get_device_capability: 9.0 (NVIDIA H100 80GB HBM3)"


def test_a_gpu_the_workers_reader_set_is_kept(monkeypatch):
    _cuda(monkeypatch)
    contract = full_contract("rollout")  # its gpu is a sample value, observed
    assert worker_records.with_device(contract)["gpu"] == contract["gpu"]


def test_a_failing_torch_is_unobservable_never_raised(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: (_ for _ in ()).throw(RuntimeError("driver gone")))
    gpu = worker_records.device_gpu()
    assert gpu.provenance is Provenance.UNOBSERVABLE and "RuntimeError: driver gone" in gpu.source


def _records(tmp_path, gpus):
    for index, gpu in enumerate(gpus):
        side = "training" if index % 2 == 0 else "rollout"
        contract = full_contract(side)
        fields = {**contract.fields, "gpu": FieldValue.observed(gpu, "test")}
        write_worker_record(tmp_path, AttentionContract(side, f"w-{index}", fields), None, "run-1")


def test_the_reported_gpu_is_the_one_most_workers_record(tmp_path):
    assert driver_report.reported_gpu(str(tmp_path), "run-1") is None
    _records(tmp_path, ["sm90", "sm90", "sm100", None])
    assert driver_report.reported_gpu(str(tmp_path), "run-1") == ("sm90", "recorded by 2 of 4 workers (torch.cuda)")


def test_the_estimate_runs_on_the_reported_gpu_and_says_so():
    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    from .. import conftest

    cfg = load_config(conftest.EXAMPLES / "grpo_math_1B_megatron_flash.yaml", [])
    ampere = nemo_rl_driver._attention_estimate(
        read_recipe_facts(cfg), ("sm80", "recorded by 2 of 2 workers (torch.cuda)")
    )
    assert ampere["assumes"][0] == "GPU sm80: recorded by 2 of 2 workers (torch.cuda)"
    assert ampere["rollout_engine"].startswith("vllm:")  # FA2's replay on Ampere
