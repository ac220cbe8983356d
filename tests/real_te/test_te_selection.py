"""What Transformer Engine's real ``get_attention_backend`` selects, against what the plugin reports.

Each case builds megatron-core's ``TEDotProductAttention`` from the TE layer spec and runs its real
forward on a declared GPU (``harness``). The oracle is what TE's forward did: the kernel it
dispatched to, its ``_attention_backends`` state and its own "Disabling ..." reasons. Against it:
``te_readback.observe`` (what a worker records after the first forward) and ``te_selector.select``
(what ``check --gpu`` runs where TE is installed) must agree, backend, version and reasons.
"""

from __future__ import annotations

import itertools

import pytest

from nemo_rl_attn_align.hosts import te_readback
from nemo_rl_attn_align.kernels import te_selector
from nemo_rl_attn_align.kernels.kernel_query import TrainingQuery
from tests.real_te import require_te

require_te()

from tests.real_te import harness, stand_ins  # noqa: E402  (the stand-ins go in before TE is imported)
from tests.real_te.harness import Case  # noqa: E402

pytestmark = pytest.mark.real_te

GPUS = {"sm80": (8, 0), "sm90": (9, 0), "sm100": (10, 0)}
BACKENDS = ("flash", "fused", "unfused", "auto")
FA3 = "3.0.0b1"


def _cases(gpu: str, backend: str):
    """One GPU and backend: dtype x head_dim x window x (CP, format) x determinism x FA3, then the
    sink softmax types (gpt-oss) over dtype x (CP, format)."""
    layouts = ((1, "sbhd"), (2, "thd"))
    for dtype, head_dim, window, (cp, fmt), deterministic, fa3 in itertools.product(
        ("bf16", "fp16", "fp32"), (64, 128, 256), (None, 127), layouts, (False, True), (None, FA3)
    ):
        yield Case(GPUS[gpu], backend, dtype, head_dim=head_dim, window=window, cp=cp, qkv_format=fmt,
                   deterministic=deterministic, flash_attn_3=fa3)  # fmt: skip
    for softmax, dtype, (cp, fmt) in itertools.product(("off-by-one", "learnable"), ("bf16", "fp32"), layouts):
        yield Case(GPUS[gpu], backend, dtype, softmax=softmax, cp=cp, qkv_format=fmt)


def _query(case: Case, gpu: str) -> TrainingQuery:
    return TrainingQuery(
        gpu, case.backend, case.dtype, case.heads, case.kv_heads, case.head_dim, case.head_dim, case.window,
        case.softmax, case.cp, case.qkv_format, case.deterministic, case.flash_attn_3 is not None, case.seq_len,
        case.batch,
    )  # fmt: skip


def _expected(outcome: harness.Outcome) -> tuple:
    """(backend, version, reasons) of what TE's forward did, in the plugin's words."""
    sel = outcome.selection
    version = {
        "FlashAttention": sel["flash_attention_backend"],
        "FusedAttention": f"sub-backend {sel['fused_attention_backend']}",
    }.get(outcome.kernel or "")
    return outcome.kernel, version, sel["reasons"]


@pytest.fixture(scope="module", autouse=True)
def readback_attached():
    te_readback.attach()
    yield
    te_readback.detach()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gpu", GPUS)
def test_readback_and_selector_equal_what_te_selected(gpu, backend):
    mismatches, kernels, explained = [], set(), 0
    for case in _cases(gpu, backend):
        outcome, module = harness.run(case)
        kernel, version, reasons = _expected(outcome)
        kernels.add(kernel)
        explained += bool(reasons)
        observed = te_readback.observe([module])
        if kernel is None:
            assert outcome.error and "No dot product attention backend" in outcome.error, case
            got = (None if observed["status"] == "no_backend" else observed, None, observed.get("reasons"))
        else:
            detail = observed.get("detail", "")
            got_version = (detail.removeprefix("flash-attn ") if kernel == "FlashAttention" else detail) or None
            got = (observed["backend"], got_version, observed.get("reasons"))
        with stand_ins.declared_device(case.gpu, flash_attn=case.flash_attn, flash_attn_3=case.flash_attn_3):
            selected = te_selector.select(_query(case, gpu))
        if got != (kernel, version, reasons):
            mismatches.append(("te_readback", case, got, (kernel, version, reasons)))
        if (selected.kernel, selected.version, list(selected.reasons)) != (kernel, version, reasons):
            mismatches.append(("te_selector", case, selected, (kernel, version, reasons)))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:2]}"
    assert kernels and explained, f"no case ran, or TE gave no reason in any: {kernels}, {explained}"


def test_mismatch_names_te_own_reason():
    """fp32 with attention_backend flash: TE finds no backend; the worker's finding says why, in TE's words."""
    outcome, module = harness.run(Case(GPUS["sm90"], "flash", "fp32"))
    observed = te_readback.observe([module])
    assert outcome.kernel is None and observed["status"] == "no_backend"
    message = te_readback.mismatch("flash", observed)
    assert message.startswith("Transformer Engine found no attention backend for AttnBackend.flash")
    assert "Transformer Engine: Disabling FlashAttention" in message and "qkv_dtype" in message, message
