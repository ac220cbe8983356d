"""Packed boundaries (issue #38 item 2): the first packed micro-batch's attention calls, stated by
the Megatron worker hook, through the stand-in NeMo-RL >= 0.6 layout with a real megatron-core
GPTModel on CPU.

The stand-in worker packs three sequences with ``nemo_rl.models.megatron.data._pack_sequences_for_megatron``
(upstream's signature and returns) and runs them through ``train.model_forward``; megatron-core's
attention layers (their ``thd`` RoPE included) call each layer's core attention with the
``packed_seq_params`` they were given. The core attention itself is ``cpu_megatron.PackedAttentionStandIn``:
on a GPU Transformer Engine's would run there, megatron-core's own local one refuses packed batches.
The real NeMo-RL packing and forward step run in the nemo_rl lane
(``tests/real_nemo_rl/test_packed_boundaries.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys

import pytest

pytest.importorskip("megatron.core")

import torch

from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.hosts import packed_boundaries
from nemo_rl_attn_align.report.document import collect
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.codes import Code
from tests.fake_nemo_rl.configs import policy_config

PACKING = {"sequence_packing": {"enabled": True}}
SITES = [f"decoder.layers.{i}.self_attention.core_attention" for i in range(2)]
THD_3 = {"qkv_format": "thd", **dict.fromkeys(packed_boundaries.CU_SEQLENS, 3)}
DATA = "nemo_rl.models.megatron.data"


def detail(tmp_path):
    return json.loads((tmp_path / "report" / "hosts" / "training--policy-rank0.json").read_text())


def hooks_left(model) -> list[str]:
    """Forward hooks and pre-hooks still on the model's modules."""
    return [name for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]


def test_a_packed_batch_with_its_boundaries_states_each_call_and_finds_nothing(hooked, tmp_path):
    worker = hooked("v0_6").MegatronPolicyWorker(policy_config("local", **PACKING))
    assert detail(tmp_path)["packed_boundaries"] is None  # nothing packed yet
    assert _patching.is_wrapped(sys.modules[DATA]._pack_sequences_for_megatron)  # waiting for the first packing
    worker.get_logprobs()
    seen = detail(tmp_path)
    assert seen["packed_boundaries"] == {
        "packed_by": f"{DATA}._pack_sequences_for_megatron",
        "sequences_packed": 3,
        "built": THD_3,
        "calls": [{"site": site, "received": THD_3, "sequences_attended": 3} for site in SITES],
        "not_called": [],
    }
    assert seen["coded_findings"] == [] and seen["findings"] == [] and seen["stage"] == "first_forward"
    # nothing left behind: the seam is upstream's function again, no hook on the model
    assert not _patching.is_wrapped(sys.modules[DATA]._pack_sequences_for_megatron)
    assert hooks_left(worker.model[0]) == [] and packed_boundaries.pending is None
    worker.get_logprobs()
    assert detail(tmp_path) == seen


def test_boundaries_dropped_on_the_way_to_the_model_are_an_error_naming_the_call(hooked, tmp_path, monkeypatch, caplog):
    worker_module = hooked("v0_6")
    monkeypatch.setattr(sys.modules["nemo_rl.models.megatron.train"], "DROPS_PACKED_SEQ_PARAMS", True)
    worker = worker_module.MegatronPolicyWorker(policy_config("local", **PACKING))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        worker.get_logprobs()
    seen = detail(tmp_path)
    assert [(c["site"], c["received"], c["sequences_attended"]) for c in seen["packed_boundaries"]["calls"]] == [
        (site, None, 1) for site in SITES
    ]
    [dropped] = seen["coded_findings"]
    assert (dropped["code"], dropped["severity"], dropped["key"], dropped["value"]) == (
        Code.PACKED_BOUNDARIES_DROPPED.value,
        "error",
        f"workers.policy-rank0.{SITES[0]}",
        "1 of 3 sequences",
    )
    assert (
        "the first packed micro-batch packed 3 sequences (nemo_rl.models.megatron.data._pack_sequences_for_megatron; "
        "NeMo-RL built PackedSeqParams whose cu_seqlens_q delimits 3), but decoder.layers.0.self_attention."
        "core_attention received no packed_seq_params and attended them as 1 (2 of the 2 attention calls"
    ) in dropped["message"]
    assert "policy.sequence_packing.enabled=false" in dropped["fix"]
    assert sum(Code.PACKED_BOUNDARIES_DROPPED.value in r.getMessage() for r in caplog.records) == 1  # in its log
    doc = collect(tmp_path / "report", AlignSettings())  # what the driver's report makes of it
    assert doc["verdict"] == "fail"
    assert [f for f in doc["findings"] if f["code"] == Code.PACKED_BOUNDARIES_DROPPED.value] == [dropped]


def test_truncated_boundaries_are_counted_as_the_kernel_reads_them(hooked, tmp_path, monkeypatch):
    """Megatron-Bridge #4400's shape: the params arrive, but a cu_seqlens delimits fewer sequences."""
    worker_module = hooked("v0_6")
    original = worker_module.model_forward

    def one_boundary(model, data_dict, ids, position_ids, attention_mask, packed_seq_params=None):
        whole, total = torch.tensor([0, ids.shape[1]], dtype=torch.int32), ids.shape[1]
        merged = dataclasses.replace(packed_seq_params, max_seqlen_q=total, max_seqlen_kv=total)
        merged.cu_seqlens_q = merged.cu_seqlens_kv = merged.cu_seqlens_q_padded = merged.cu_seqlens_kv_padded = whole
        return original(model, data_dict, ids, position_ids, attention_mask, packed_seq_params=merged)

    monkeypatch.setattr(worker_module, "model_forward", one_boundary)
    worker_module.MegatronPolicyWorker(policy_config("local", **PACKING)).get_logprobs()
    [dropped] = detail(tmp_path)["coded_findings"]
    assert (
        dropped["value"] == "1 of 3 sequences"
        and "received packed_seq_params whose cu_seqlens_q delimits 1" in dropped["message"]
    )


def test_strict_mode_stops_the_run_after_the_statement_is_written(hooked, tmp_path, monkeypatch):
    worker_module = hooked("v0_6")
    monkeypatch.setattr(sys.modules["nemo_rl.models.megatron.train"], "DROPS_PACKED_SEQ_PARAMS", True)
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    worker = worker_module.MegatronPolicyWorker(policy_config("local", **PACKING))
    with pytest.raises(_patching.StrictModeError, match=Code.PACKED_BOUNDARIES_DROPPED.value):
        worker.get_logprobs()
    assert detail(tmp_path)["coded_findings"][0]["code"] == Code.PACKED_BOUNDARIES_DROPPED.value
    assert hooks_left(worker.model[0]) == []


def test_no_packing_no_watch(hooked, tmp_path):
    worker = hooked("v0_6").MegatronPolicyWorker(policy_config("local"))
    worker.get_logprobs()
    assert detail(tmp_path)["packed_boundaries"] is None and packed_boundaries.pending is None
    assert hooks_left(worker.model[0]) == []


def test_a_nemo_rl_without_the_packing_seam_is_a_visible_note(hooked, tmp_path, monkeypatch, caplog):
    worker_module = hooked("v0_6")
    packed_boundaries.detach()
    monkeypatch.delattr(sys.modules[DATA], "_pack_sequences_for_megatron")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        worker_module.MegatronPolicyWorker(policy_config("local", **PACKING))
    [note] = detail(tmp_path)["findings"]
    assert note.startswith("policy.sequence_packing.enabled is true, but no packing function the plugin knows")
    assert any(
        f"{DATA}._pack_sequences_for_megatron(input_ids, seq_lengths, ...) not found" in r.getMessage()
        for r in caplog.records
    )
    assert packed_boundaries.pending is None


def test_a_failing_statement_is_one_warning_and_the_forward_returns(hooked, tmp_path, monkeypatch, caplog):
    worker_module = hooked("v0_6")

    def broken(worker_id, statement):
        raise KeyError("sequences_packed")

    monkeypatch.setattr(packed_boundaries, "dropped_finding", broken)
    worker = worker_module.MegatronPolicyWorker(policy_config("local", **PACKING))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        logprobs = worker.get_logprobs()
    assert logprobs.shape[:2] == (1, 12)
    assert any("stating the packed boundaries failed" in r.getMessage() for r in caplog.records)
    assert hooks_left(worker.model[0]) == []


@pytest.mark.parametrize(
    ("received", "rows", "attended"),
    [
        (None, 1, 1),
        (None, 4, 4),
        ({"qkv_format": "sbhd", **dict.fromkeys(packed_boundaries.CU_SEQLENS, 3)}, 1, 1),
        (THD_3, 1, 3),
        ({**THD_3, "cu_seqlens_q": 0}, 1, 0),  # an empty cu_seqlens (Megatron-Bridge #4400's argmin truncation)
        ({**THD_3, "cu_seqlens_kv": None}, 1, 0),
        ({**THD_3, "cu_seqlens_q_padded": None, "cu_seqlens_kv_padded": 2}, 1, 2),
    ],
)
def test_sequences_attended(received, rows, attended):
    assert packed_boundaries.sequences_attended(received, rows) == attended


def test_boundaries_of_params():
    from megatron.core.packed_seq_params import PackedSeqParams

    assert packed_boundaries.boundaries(None) is None
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=torch.tensor([0, 4, 9]), cu_seqlens_kv=torch.tensor([], dtype=torch.int32)
    )
    assert packed_boundaries.boundaries(params) == {
        "qkv_format": "thd",
        "cu_seqlens_q": 2,
        "cu_seqlens_kv": 0,
        "cu_seqlens_q_padded": None,
        "cu_seqlens_kv_padded": None,
    }
