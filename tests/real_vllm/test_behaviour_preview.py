"""``check --rollout-python``'s side (``hosts.behaviour_preview``) against real vLLM engines: for the
same model directory and engine arguments, vLLM's model built on the meta device (no weights, each
rotary's cos/sin cache computed on the CPU) gives the ``rope``, ``mask`` and ``softmax`` the engine's
worker records after warm-up (``test_behaviour.py``'s engines), value and source, exactly."""

from __future__ import annotations

import json

import pytest

from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from tests.conftest import module_json
from tests.real_vllm.conftest import BASE_ARGS, ENGINES, VLLM_0251

pytestmark = pytest.mark.real_vllm

#: The engines compared (lane vllm_0251 starts no gemma3 or glm4 engine).
COMPARED = ("qwen3", "mistral", "gemma2", "gpt-oss") + (() if VLLM_0251 else ("gemma3", "glm4"))


@pytest.fixture(scope="module")
def previews(models, tmp_path_factory) -> dict:
    sides = {}
    for name in COMPARED:
        arch, args, _ = ENGINES[name]
        sides[name] = {"model": str(models[arch]), **BASE_ARGS, **args}
    path = tmp_path_factory.mktemp("preview-sides") / "sides.json"
    path.write_text(json.dumps(sides))
    return module_json("tests.real_vllm.preview_sides", str(path))


@pytest.mark.parametrize("name", COMPARED)
def test_checks_preview_computes_what_the_engine_records(engines, previews, name):
    recorded = engines(name).record()["contract"]["fields"]
    preview = previews[name]
    assert "error" not in preview and preview["problems"] == [], preview
    assert preview["substitutions"] == []
    for field in BEHAVIOUR_FIELDS:
        assert recorded[field]["provenance"] == "observed", recorded[field]["source"]
        assert preview["fields"][field] == recorded[field], field
