"""Reading back Transformer Engine's backend choice, against modules laid out like TE's.

TE does not install on CPU. The stand-in tree written here has TE's module paths
(``transformer_engine/pytorch/attention/dot_product_attention/{utils,dot_product_attention}.py``), the
``get_attention_backend`` return tuple and the ``_attention_backends`` module global of TE 2.4+
(read at NVIDIA/TransformerEngine d0067d0). Real-TE tests run on GPU nodes (``-m mcore``).
"""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from nemo_rl_attn_align.hosts import te_readback
from nemo_rl_attn_align.kernels import te_selector
from nemo_rl_attn_align.vocab import patching as _patching
from tests.hosts.conftest import standin

UTILS = """
import logging

class AttentionLogging:
    _log_level = logging.WARNING
    _stream_handler = logging.StreamHandler()

def get_attention_backend(attention_params=None):
    logger = logging.getLogger("DotProductAttention")
    logger.setLevel(AttentionLogging._log_level)
    if not logger.hasHandlers():
        logger.addHandler(AttentionLogging._stream_handler)
    flash, fused, unfused = attention_params
    if not flash:
        logger.debug("Disabling FlashAttention 2 for %s", "a test reason")
    return (flash, FLASH_VERSION if flash else None, fused, 1 if fused else None, unfused, [flash, fused, unfused])

class _Version:
    major = 2
    def __str__(self):
        return "2.7.3"

FLASH_VERSION = _Version()
"""

DPA = """
from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa_utils

_attention_backends = {"attention_params": None, "use_flash_attention": None, "flash_attention_backend": None,
                       "use_fused_attention": None, "fused_attention_backend": None, "use_unfused_attention": None,
                       "backend_selection_requires_update": False}

class DotProductAttention:
    def forward(self, params):
        (_attention_backends["use_flash_attention"], _attention_backends["flash_attention_backend"],
         _attention_backends["use_fused_attention"], _attention_backends["fused_attention_backend"],
         _attention_backends["use_unfused_attention"], _) = dpa_utils.get_attention_backend(params)
        _attention_backends["attention_params"] = params
"""


@pytest.fixture
def fake_te(tmp_path, bootstrap_state):
    pkg = tmp_path / "transformer_engine" / "pytorch" / "attention" / "dot_product_attention"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "transformer_engine", pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(textwrap.dedent(UTILS))
    (pkg / "dot_product_attention.py").write_text(textwrap.dedent(DPA))
    te_readback.selections.clear()
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    with standin(tmp_path, "transformer_engine"):
        import transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention as dpa

        yield dpa
    te_readback.detach()


def te_module(dpa):
    """Stands for megatron.core.extensions.transformer_engine.TEDotProductAttention (a TE subclass)."""
    cls = type("TEDotProductAttention", (dpa.DotProductAttention,), {})
    return cls()


def test_selection_names_follow_te_forward_order():
    assert te_readback.selection_from_flags(True, None, True, 1, True)["backend"] == "FlashAttention"
    assert te_readback.selection_from_flags(False, None, True, 1, True) == {
        "backend": "FusedAttention",
        "detail": "sub-backend 1",
    }
    assert te_readback.selection_from_flags(False, None, False, None, True)["backend"] == "UnfusedDotProductAttention"
    assert te_readback.selection_from_flags(False, None, False, None, False)["backend"] is None


def test_wrapped_selection_and_module_global_are_read_back(fake_te):
    utils = sys.modules[te_readback.UTILS_MODULE]
    assert _patching.is_wrapped(utils.get_attention_backend)
    layer = te_module(fake_te)
    assert te_readback.observe([layer])["status"] == "unobservable"  # before the first forward: never "applied"
    layer.forward((False, True, True))
    seen = te_readback.observe([layer])
    assert seen == {
        "status": "observed",
        "engine": "megatron-te",
        "source": f"{te_readback.DPA_MODULE}._attention_backends",
        "backend": "FusedAttention",
        "detail": "sub-backend 1",
        "reasons": ["Disabling FlashAttention 2 for a test reason"],
    }
    assert te_readback.selections == [
        {
            "backend": "FusedAttention",
            "detail": "sub-backend 1",
            "reasons": ["Disabling FlashAttention 2 for a test reason"],
        }
    ]
    assert te_readback.mismatch("flash", seen) == (
        "attention_backend requested AttnBackend.flash (FlashAttention) but the model ran FusedAttention "
        f"({te_readback.DPA_MODULE}._attention_backends); "
        "Transformer Engine: Disabling FlashAttention 2 for a test reason"
    )
    assert te_readback.mismatch("fused", seen) is None and te_readback.mismatch("auto", seen) is None


def test_reasons_are_collected_without_changing_what_te_prints(fake_te, capsys):
    """TE's own handler keeps the user's level (no debug lines on stderr) and the logger's level is
    TE's again after the call, although the plugin read TE's debug reasons."""
    utils = sys.modules[te_readback.UTILS_MODULE]
    logger = logging.getLogger("DotProductAttention")
    te_module(fake_te).forward((False, False, True))
    assert capsys.readouterr().err == ""
    assert logger.level == logging.WARNING and utils.AttentionLogging._log_level == logging.WARNING
    assert not any(isinstance(h, te_selector._ReasonCollector) for h in logger.handlers)
    assert te_readback.selections[-1]["reasons"] == ["Disabling FlashAttention 2 for a test reason"]


def test_no_backend_reads_back_with_te_reasons_even_when_the_forward_raises(fake_te):
    torch = pytest.importorskip("torch")

    core_cls = type("TEDotProductAttention", (fake_te.DotProductAttention, torch.nn.Module), {})

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.core = core_cls()

        def forward(self, x):
            self.core.forward((False, False, False))
            raise ValueError("No dot product attention backend is available for the provided inputs.")

    seen: list[dict] = []
    model = Model()
    te_readback.watch_first_forward(model, seen.append)
    with pytest.raises(ValueError, match="No dot product attention backend"):
        model(torch.ones(1))
    assert seen and seen[0]["status"] == "no_backend" and seen[0]["backend"] is None
    assert te_readback.mismatch("flash", seen[0]) == (
        "Transformer Engine found no attention backend for AttnBackend.flash; Transformer Engine: "
        "Disabling FlashAttention 2 for a test reason"
    )


def test_wrapped_selection_is_the_fallback_when_the_global_is_gone(fake_te):
    layer = te_module(fake_te)
    layer.forward((True, False, True))
    del fake_te._attention_backends
    seen = te_readback.observe([layer])
    assert seen["backend"] == "FlashAttention" and seen["flash_attention_version"] == 2
    assert seen["source"].endswith("get_attention_backend (wrapped)")


def test_no_attention_module_is_unobservable():
    assert te_readback.observe([object()]) == {
        "status": "unobservable",
        "backend": None,
        "engine": None,
        "source": "no Megatron or TE core-attention module in the model",
    }


def test_a_failing_read_back_never_breaks_the_forward(monkeypatch, caplog):
    """The hook runs inside the user's forward: ``observe`` failing is one warning, an error only if strict."""
    torch = pytest.importorskip("torch")

    def broken(modules):
        raise RuntimeError("TE moved its module global")

    monkeypatch.setattr(te_readback, "_attention_module_kinds", broken)
    seen = []
    model = torch.nn.Linear(4, 4)
    te_readback.watch_first_forward(model, seen.append)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        out = model(torch.ones(1, 4))
    assert out.shape == (1, 4) and seen == []
    assert any(
        "reading back the attention backend failed (RuntimeError: TE moved" in r.getMessage() for r in caplog.records
    )
    model(torch.ones(1, 4))  # fired once, then removed
    strict_model = torch.nn.Linear(4, 4)
    te_readback.watch_first_forward(strict_model, seen.append, strict=True)
    with pytest.raises(RuntimeError, match="TE moved"):
        strict_model(torch.ones(1, 4))


def test_the_flash_attn_version_te_ran_is_recorded(fake_te):
    from nemo_rl_attn_align.contract.training import training_contract

    layer = te_module(fake_te)
    layer.forward((True, False, True))
    contract = training_contract(None, "policy-rank0", te_readback.observe([layer]))
    assert (
        contract.value("flash_attention_version") == 2
        and contract["flash_attention_version"].provenance.value == "observed"
    )
    assert "flash-attn 2.7.3" in contract["flash_attention_version"].source
