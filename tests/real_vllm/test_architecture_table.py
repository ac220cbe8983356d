"""The rollout side of the architecture table against vLLM itself.

* The committed table is what vLLM's model code answers today over every sampled config.
* An architecture the table lacks is read by vLLM itself in a subprocess, and says so.
* The rollout table's head-size classes are exact for vLLM's real CUDA selector.
* A real engine of a tiny random-weight gpt-oss records the attention the preview predicts from the
  table for its config.json: learnable sinks, a window on every other layer; one of a Gemma 2 its
  window on every other layer, its logit soft cap and its scale of ``query_pre_attn_scalar``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_the_committed_rollout_side_is_what_vllm_answers_today():
    done = _run(str(REPO / "scripts" / "update_architecture_table.py"), "rollout", "--check", timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "architectures.json (rollout) is current" in done.stdout


def test_an_architecture_the_table_lacks_is_read_by_vllm_itself(models, monkeypatch):
    from nemo_rl_attn_align.model import architectures
    from nemo_rl_attn_align.model.model_facts import hosts_read_here, read_model_facts

    model = str(models["mistral"])
    from_table = read_model_facts(model).rollout
    table = architectures.load()
    monkeypatch.setattr(architectures, "load", lambda: {**table, "rollout": {**table["rollout"], "architectures": {}}})
    with hosts_read_here():
        live = read_model_facts(model).rollout
    assert live.source.startswith("vLLM run here (the architecture table lacks it)")
    assert live.kinds == from_table.kinds and from_table.kinds[0].window == 63


def test_every_head_size_of_a_class_gets_its_representatives_answer():
    done = _run("-m", "tests.real_vllm.head_size_classes")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


#: What each engine's record shows of its attention beside the identity fields.
ENGINE_ATTENTION = {
    "gpt-oss": {"softmax_type": "learnable", "layer_windows": [63, None], "logit_softcapping": None},
    "gemma2": {"layer_windows": [63, None], "logit_softcapping": 50.0, "softmax_scale": 0.125},
}


@pytest.mark.parametrize("name", sorted(ENGINE_ATTENTION))
def test_a_real_engine_records_the_attention_the_preview_predicts(engines, name):
    from nemo_rl_attn_align.contract.attention_identity import FIELDS
    from nemo_rl_attn_align.contract.contract import AttentionContract
    from nemo_rl_attn_align.contract.contract_preview import predict_rollout
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    engine = engines(name)
    record = AttentionContract.from_dict(engine.record()["contract"])
    policy = {"model_name": str(engine.model), "precision": "bfloat16", "generation": {"backend": "vllm"}}
    preview = predict_rollout(read_recipe_facts({"policy": policy}, {}), {})
    for field in FIELDS:
        assert record[field].provenance.value == "observed", (field, record[field])
        assert record.value(field) == preview.value(field), (field, record.value(field), preview.value(field))
    for field in ("softmax_scale", "logit_softcapping"):  # the preview's from vLLM's reading, not config.json's
        assert record.value(field) == preview.value(field), (field, record.value(field), preview.value(field))
        assert preview[field].source.startswith("vLLM's reading of"), preview[field]
    assert {field: record.value(field) for field in ENGINE_ATTENTION[name]} == ENGINE_ATTENTION[name]
