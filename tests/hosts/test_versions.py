"""Supported host versions are data: PEP 440 ranges checked once per process at attach."""

from __future__ import annotations

import logging
import re

import pytest

from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab import patching as _patching


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(versions, "_checked", set())


@pytest.mark.parametrize(
    ("host", "version", "inside"),
    [
        ("vLLM", "0.25.1", True),
        ("vLLM", "0.25.1+cpu", True),
        ("vLLM", "0.33.0rc1", True),
        ("vLLM", "0.34.0rc1", False),
        ("vLLM", "0.34.0.dev20260101", False),
        ("NeMo-RL", "0.5.0rc0", True),  # what NeMo-RL's v0.5.0 tag reports (nemo_rl/package_info.py)
        ("NeMo-RL", "0.6.0+a1b2c3d", True),
        ("vLLM", "0.34.0", False),
        ("vLLM", "0.10.2", False),
        ("NeMo-RL", "0.7.0", True),
        ("NeMo-RL", "0.4.0", False),
        ("Transformer Engine", "2.3.0", False),
        ("vLLM", "not-a-version", None),
    ],
)
def test_is_supported(host, version, inside):
    assert versions.is_supported(host, version) is inside


def test_outside_the_range_warns_once_and_strict_raises(monkeypatch, caplog):
    monkeypatch.setattr(versions, "installed_version", lambda host: "0.40.0")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        assert versions.check_supported("vLLM", strict=False) == "0.40.0"
        versions.check_supported("vLLM", strict=False)
    assert [r.getMessage() for r in caplog.records].count(
        "nemo-rl-attn-align: vLLM 0.40.0 is outside the supported range >=0.11,<0.34; "
        "the plugin attaches where the layout matches and records what it can."
    ) == 1
    monkeypatch.setattr(versions, "_checked", set())
    with pytest.raises(_patching.HostLayoutError, match=re.escape("vLLM 0.40.0 is outside")):
        versions.check_supported("vLLM", strict=True)


def test_version_read_from_the_imported_module_first(monkeypatch):
    import types

    monkeypatch.setitem(__import__("sys").modules, "nemo_rl", types.SimpleNamespace(__version__="0.7.0"))
    assert versions.installed_version("NeMo-RL") == "0.7.0"
