"""Upstream bugs 1-3 caught at step 0 (docs/upstream-bugs.md): each re-introduced into the real host
code (Megatron-Bridge 0.6.2 in lane nemo_rl's venv: ``bridge_reverts.py``; vLLM in lane vllm's:
``tests/real_vllm/reverts.py``), both sides started as a NeMo-RL run starts them (``conftest.Step0``),
then ``nemo-rl-attn-align report`` on the step-0 records. Each bug is one behaviour finding naming the
field, the layer and the position, with the configuration fields equal or explaining it; the same
run with the fix in place has no error finding.
"""

from __future__ import annotations

import pytest

from tests.upstream_bugs.cases import MODELS

pytestmark = pytest.mark.real_cross_engine

BEHAVIOUR = "ATTN_BEHAVIOUR_MISMATCH"
#: Hugging Face's sliding_window of each model: the query and the W - 1 keys before it.
WINDOW = {"mistral": 64, "gemma2": 64, "gpt-oss": MODELS["gpt-oss"][1]["sliding_window"]}
#: The report folders run with the upstream fix in place (``cases.REPORTS``).
FIXED = ("mistral", "gemma2", "gpt-oss", "qwen3-yarn-rounded")


def _errors(report) -> list[dict]:
    return [f for f in report.doc["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("model", ["mistral", "gemma2", "gpt-oss"])
def test_megatron_bridge_2656_window_off_by_one(step0, model):
    report = step0.report(f"{model}-2656")
    w = WINDOW[model]
    found = report.finding(BEHAVIOUR, "mask")
    assert found is not None and report.exit_code != 0, report.text
    seen = f"the training kernel sees {w + 1} tokens, the rollout kernel {w} tokens"
    assert found["message"].startswith(f"mask: layer 0: from query position {w} on, {seen}")
    assert (
        "the window is off by one" in found["fix"]
        and f"++policy.megatron_cfg.model_overrides.window_size=[{w - 1},0]" in found["fix"]
    )
    assert report.row("mask")["status"] == "mismatch"
    print(report.line(BEHAVIOUR, "mask"))


def test_megatron_bridge_4875_gemma2_layer_kinds_inverted(step0):
    report = step0.report("gemma2-4875")
    found = report.finding(BEHAVIOUR, "mask")
    assert found is not None, report.text
    assert found["message"].startswith(
        "mask: layer 0: from query position 64 on, the training kernel sees every earlier token, the rollout kernel "
        "64 tokens; training windows layers 1, rollout layers 0;"
    )
    assert "on different layers" in found["fix"]
    print(report.line(BEHAVIOUR, "mask"))


def test_gemma2_on_megatron_cores_local_backend_loses_its_soft_cap_and_layer_kinds(step0):
    """Not one of the issue's list: Megatron-Bridge 0.6.2's ``provide()`` puts megatron-core's
    DotProductAttention in place of Gemma 2's own under ``attention_backend: local`` (every layer
    windowed, neither ``query_pre_attn_scalar``'s scale nor the soft cap), found by the same
    fingerprints with no rule of its own."""
    report = step0.report("gemma2-local")
    mask, softmax = report.finding(BEHAVIOUR, "mask"), report.finding(BEHAVIOUR, "softmax")
    assert mask is not None and "training windows layers 0-1, rollout layers 0;" in mask["message"], report.text
    assert softmax is not None
    assert softmax["message"].startswith(
        "softmax: layer 0: training scales QK^T by 0.176777, rollout scales QK^T by 0.125"
    )
    assert "logit_softcapping training None, rollout 50.0" in softmax["message"]


def test_megatron_bridge_1155_gpt_oss_yarn_attention_factor(step0):
    report = step0.report("gpt-oss-1155")
    found = report.finding(BEHAVIOUR, "rope")
    assert found is not None, report.text
    assert found["message"].startswith("rope: layer 0, channels ")
    assert "training scales the rotation by 1, rollout by 1.34657" in found["message"]
    assert report.row("rope_parameters")["status"] != "mismatch"  # both read one config.json


def test_vllm_27722_yarn_band_rounded_while_the_configs_agree(step0):
    report = step0.report("vllm-27722")
    found = report.finding(BEHAVIOUR, "rope")
    assert found is not None, report.text
    assert found["message"].startswith("rope: layer 0, position ")
    assert "training rotates by" in found["message"] and "a YaRN correction band rounded" in found["fix"]
    for field in ("rope_type", "rope_parameters"):
        assert report.row(field)["status"] == "match", report.row(field)
    print(report.line(BEHAVIOUR, "rope"))


def test_yarn_fields_megatron_reads_otherwise_are_the_explanation(step0):
    """Megatron-Bridge #5378's class: a YaRN config whose band megatron-core does not round (its
    ``yarn_correction_range_round_to_int`` off) while Hugging Face and vLLM round it (``truncate`` left
    out: true): the rope differs, and ``rope_parameters`` explains it (``truncate`` false against true)."""
    report = step0.report("qwen3-yarn")
    found = report.finding(BEHAVIOUR, "rope")
    assert found is not None and found["message"].startswith("rope: layer 0, position "), report.text
    explained = report.finding("ATTN_EXPLAINED_DIFFERENCE", "rope_parameters")
    assert explained is not None and "'truncate': False" in explained["message"]
    assert "'truncate': True" in explained["message"]


@pytest.mark.parametrize("name", FIXED)
def test_with_the_fix_in_place_the_same_run_has_no_error(step0, name):
    report = step0.report(name)
    assert _errors(report) == [] and report.exit_code == 0, report.text
    for field in ("rope", "mask", "softmax"):
        assert report.row(field)["status"] == "match", report.row(field)
