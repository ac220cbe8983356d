"""The kernel pair a binding reads from the two records (``kernels.record_kernel_pair``), in ``check --gpu``'s words."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.binding.binding import bind
from nemo_rl_attn_align.contract.contract import FieldValue
from tests.contract_samples import full_contract


def _pair(training: dict, rollout: dict):
    def contract(side, fields):
        return full_contract(side, f"{side}-0", **{k: FieldValue.observed(v, "test") for k, v in fields.items()})

    return bind(contract("training", training), contract("rollout", rollout))


HOPPER_FA2 = {"backend": "FlashAttention", "flash_attention_version": 2, "gpu": "sm90"}


def _flash(version):
    return {"backend": "FLASH_ATTN", "flash_attention_version": version}


@pytest.mark.parametrize(
    "training, rollout, labels, one",
    [
        (HOPPER_FA2, _flash(2), ("FlashAttention 2", "FLASH_ATTN FA2"), True),
        (HOPPER_FA2, _flash(3), ("FlashAttention 2", "FLASH_ATTN FA3"), False),
        (HOPPER_FA2, _flash(None), ("FlashAttention 2", "FLASH_ATTN"), None),
        (
            {"backend": "FusedAttention", "flash_attention_version": None},
            {"backend": "TRITON_ATTN", "flash_attention_version": None},
            ("FusedAttention", "TRITON_ATTN"),
            False,
        ),
    ],
)  # fmt: skip
def test_the_pair_and_whether_it_is_one_flash_attn_generation(training, rollout, labels, one):
    pair = _pair(training, rollout).to_dict()["kernel_pair"]
    assert (pair["training"], pair["rollout"]) == labels and pair["one_generation"] is one


def test_a_record_whose_backend_is_pending_leaves_the_pair_open():
    training = full_contract("training", backend=FieldValue.pending("known at runtime"))
    pair = bind(training, full_contract("rollout")).to_dict()["kernel_pair"]
    assert pair["training"] == "pending" and pair["one_generation"] is None and pair["documented"] == []


def test_flashinfer_on_blackwell_against_te_is_a_documented_pair_among_the_binding_findings():
    binding = _pair(
        {"backend": "FusedAttention", "flash_attention_version": None, "gpu": "sm100"},
        {"backend": "FLASHINFER", "flash_attention_version": None, "gpu": "sm100"},
    )
    (warning,) = [f for f in binding.findings() if f.code.value == "KERNEL_PAIR_DOCUMENTED"]
    assert "grpo-gptoss-20b-8n4g-megatron.yaml" in warning.message and "TRITON_ATTN" in warning.fix
    assert binding.to_dict()["kernel_pair"]["gpu"] == {"training": "sm100", "rollout": "sm100"}
    assert binding.passed  # a warning: the verdict is the tiers'


def test_fa3_under_batch_invariance_on_hopper_is_documented_from_the_records():
    rollout = {"backend": "FLASH_ATTN", "flash_attention_version": 3, "batch_invariant": True, "gpu": "sm90"}
    binding = _pair(HOPPER_FA2, rollout)
    assert [f.code.value for f in binding.kernels.documented] == ["KERNEL_PAIR_DOCUMENTED"]
    assert "#47069" in binding.kernels.documented[0].message
    pinned = _pair(HOPPER_FA2, {**rollout, "flash_attention_version": 2})
    assert pinned.kernels.documented == () and pinned.kernels.one_generation is True
    no_gpu = _pair({**HOPPER_FA2, "gpu": None}, {**rollout, "gpu": None})
    assert no_gpu.kernels.documented == ()  # matched only where a record names the GPU
