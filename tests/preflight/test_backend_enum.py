"""The names known without megatron-core equal the real enum; the NVTE plan equals what Megatron sets."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from nemo_rl_attn_align.preflight.backend import (
    ATTN_BACKEND_VALUES,
    BACKEND_NAMES,
    NVTE_BY_BACKEND,
    NVTE_VARIABLES,
    to_attn_backend,
)
from nemo_rl_attn_align.preflight.plan import build_plan_for_policy

enums = pytest.importorskip(
    "megatron.core.transformer.enums", reason="megatron-core is not installed (pip install -e .[test])"
)
language_module = pytest.importorskip("megatron.core.models.common.language_module.language_module")


def test_names_and_values_equal_the_real_enum():
    assert {m.name: m.value for m in enums.AttnBackend} == ATTN_BACKEND_VALUES
    assert list(BACKEND_NAMES) == [m.name for m in enums.AttnBackend]


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_to_attn_backend_returns_the_real_member(name):
    assert to_attn_backend(name) is enums.AttnBackend[name]


def test_default_of_transformer_config_is_auto():
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2)
    assert cfg.attention_backend is enums.AttnBackend.auto


def _megatron_sets(member, monkeypatch, preset=None):
    for var in NVTE_VARIABLES:  # set, then removed: monkeypatch then undoes what Megatron sets too
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    for var, value in (preset or {}).items():
        monkeypatch.setenv(var, value)
    fake_module = SimpleNamespace(config=SimpleNamespace(attention_backend=member))
    language_module.LanguageModule._set_attention_backend(fake_module)
    return {var: os.environ[var] for var in NVTE_VARIABLES}


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_nvte_plan_equals_megatrons_set_attention_backend(name, monkeypatch):
    assert _megatron_sets(enums.AttnBackend[name], monkeypatch) == NVTE_BY_BACKEND[name]


def test_conflict_rule_predicts_megatrons_assert(monkeypatch):
    """NVTE_ENV_CONFLICT is reported exactly when Megatron's own assert fails."""
    policy = {"precision": "bfloat16", "megatron_cfg": {"enabled": True}}
    for preset in ({"NVTE_FLASH_ATTN": "0"}, {"NVTE_FLASH_ATTN": "1"}, {"NVTE_UNFUSED_ATTN": "true"}):
        predicted = "NVTE_ENV_CONFLICT" in [f.code for f in build_plan_for_policy(policy, preset).findings]
        try:
            _megatron_sets(enums.AttnBackend.auto, monkeypatch, preset)
            failed = False
        except AssertionError:
            failed = True
        assert predicted == failed, preset
