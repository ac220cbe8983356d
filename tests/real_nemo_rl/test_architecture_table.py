"""The training side of the architecture table against Megatron-Bridge and megatron-core themselves.

* The committed table is what Megatron-Bridge answers today over every sampled config.
* The per-layer layout the plugin ports (``model_attention.megatron_symbols`` / ``megatron_window``)
  is megatron-core's own (``parse_hybrid_pattern``, ``get_linear_attention_pattern``,
  ``is_layer_window_attention``) over random attributes.
* An architecture the table lacks is read by Megatron-Bridge itself in a subprocess, and says so.
* The Megatron worker's record of a provider Megatron-Bridge made from a config.json has the
  attention identity the preview predicts from the table for that config.
* Gemma 2's and Gemma 3's providers lay their layers out in their own core-attention modules: the
  table's per-layer window, scale and soft cap are what those modules hold in the model NeMo-RL's
  path builds, on configs the generator never sampled; with Megatron-Bridge #4875 re-introduced
  (Gemma 2's ``layer_number % 2 == 1`` back to ``== 0``, in a copy of the installed module) the
  model's layers are the table's inverted, and the reader sees the inversion a regenerated table
  would carry.
"""

from __future__ import annotations

import os
import random
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import module_json
from tests.real_nemo_rl.conftest import LANE_VARIABLE, table_check

pytestmark = pytest.mark.real_nemo_rl

REPO = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).parent / "stand_ins"


@pytest.fixture(scope="module", autouse=True)
def _in_lane():
    if os.environ.get(LANE_VARIABLE) != "nemo_rl":
        pytest.skip(f"runs in lane .ci/lanes/nemo_rl.sh ({LANE_VARIABLE}=nemo_rl), whose venv has Megatron-Bridge")


@pytest.fixture(scope="module", autouse=True)
def stand_ins(_in_lane):
    """Transformer Engine's stand-in, which Megatron-Bridge imports (``stand_ins/attn_align_stand_ins.py``),
    loaded before this module's first megatron import: megatron-core reads what TE offers once, at import."""
    if "megatron.core" in sys.modules and "attn_align_stand_ins" not in sys.modules:
        pytest.fail("megatron.core was imported before the Transformer Engine stand-in; its TE flags are already off")
    sys.path.insert(0, str(STAND_INS))
    try:
        import attn_align_stand_ins  # noqa: F401
    finally:
        sys.path.remove(str(STAND_INS))


def test_the_committed_training_side_is_what_megatron_bridge_answers_today():
    out = table_check("update_architecture_table.py", "training", timeout=1200)
    assert "architectures.json (training) is current" in out


def _random_attributes(rng: random.Random) -> dict:
    layers = rng.randint(1, 12)
    attributes = {"num_layers": layers, "multi_latent_attention": rng.random() < 0.3}
    choice = rng.randrange(3)
    if choice == 0:
        symbols = "".join(rng.choice("M*-EG") for _ in range(layers))
        attributes["hybrid_layer_pattern"] = symbols + (rng.choice(["", "/*-"]) if layers > 1 else "")
    elif choice == 1:
        attributes["experimental_attention_variant"] = "gated_delta_net"
        attributes["linear_attention_freq"] = (
            rng.randint(1, 5) if rng.random() < 0.5 else [rng.randint(0, 1) for _ in range(layers)]
        )
    attributes["window_size"] = rng.choice([None, (rng.randint(1, 300), 0)])
    attributes["window_attn_skip_freq"] = rng.choice(
        [None, rng.randint(1, 4), [rng.randint(0, 1) for _ in range(layers)]]
    )
    return attributes


def test_the_per_layer_layout_is_megatron_cores_own():
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    from megatron.core.models.hybrid.hybrid_layer_allocation import Symbols, parse_hybrid_pattern
    from megatron.core.transformer.utils import is_layer_window_attention

    from nemo_rl_attn_align.model.model_attention import megatron_symbols, megatron_window

    rng = random.Random(29)
    for _ in range(400):
        attributes = _random_attributes(rng)
        ours = megatron_symbols(attributes)
        if "hybrid_layer_pattern" in attributes:
            main = parse_hybrid_pattern(attributes["hybrid_layer_pattern"]).main_pattern
            theirs = [symbol == Symbols.ATTENTION for symbol in main]
        elif "linear_attention_freq" in attributes:
            pattern = get_linear_attention_pattern(types.SimpleNamespace(**attributes))
            theirs = [flag == 0 for flag in pattern]
        else:
            theirs = [True] * attributes["num_layers"]
        assert [symbol in ("self", "mla") for symbol in ours] == theirs, attributes
        window = attributes["window_size"]
        for number in range(1, len(ours) + 1):
            windowed = is_layer_window_attention(window, attributes["window_attn_skip_freq"], number)
            assert megatron_window(attributes, number) == (window[0] if windowed else None), (attributes, number)


def _config_dir(tmp_path: Path, model_type: str) -> Path:
    from tests.conftest import write_transformers_config

    return write_transformers_config(tmp_path / model_type, model_type, num_hidden_layers=4)


def test_an_architecture_the_table_lacks_is_read_by_megatron_bridge_itself(tmp_path, monkeypatch):
    from nemo_rl_attn_align.model import architectures
    from nemo_rl_attn_align.model.model_facts import hosts_read_here, read_model_facts

    model = _config_dir(tmp_path, "gpt_oss")
    from_table = read_model_facts(str(model)).training
    preload = tmp_path / "preload"
    preload.mkdir()
    (preload / "sitecustomize.py").write_text("import attn_align_stand_ins  # Transformer Engine for Megatron-Bridge\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(preload), str(STAND_INS), str(REPO)]))
    table = architectures.load()
    without = {**table, "training": {**table["training"], "architectures": {}}}
    monkeypatch.setattr(architectures, "load", lambda: without)
    with hosts_read_here():
        live = read_model_facts(str(model)).training
    assert live.source.startswith("Megatron-Bridge run here (the architecture table lacks it)")
    assert live.kinds == from_table.kinds and from_table.kinds[0].softmax == "learnable"


@pytest.mark.parametrize("model_type", ["qwen3", "gpt_oss", "deepseek_v3", "nemotron_h", "qwen3_next"])
def test_the_worker_record_of_megatron_bridges_provider_is_what_the_preview_predicts(tmp_path, model_type):
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    from nemo_rl_attn_align.contract.attention_identity import FIELDS
    from nemo_rl_attn_align.contract.contract_preview import predict_training
    from nemo_rl_attn_align.contract.megatron_snapshot import read_model_config
    from nemo_rl_attn_align.contract.training import training_contract
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts

    model = _config_dir(tmp_path, model_type)
    provider = AutoBridge.from_hf_config(AutoConfig.from_pretrained(model)).to_megatron_provider(load_weights=False)
    provider.finalize()
    record = training_contract(read_model_config(provider), "policy-rank0")
    policy = {"model_name": str(model), "precision": "bfloat16", "megatron_cfg": {"enabled": True}}
    preview = predict_training(read_recipe_facts({"policy": policy}, {}))
    for name in FIELDS:  # known on both sides alike (gpt-oss: sliding_window differs per layer on both)
        assert record[name].known == preview[name].known, (name, record[name], preview[name])
        assert record.value(name) == preview.value(name), name
    assert record["layer_windows"].known and record["attention_layers"].known


#: The Gemma configs checked: none of them a sampled one (other layer counts, windows, scalars).
GEMMA_CASES = [
    ("gemma2", {"num_hidden_layers": 7, "sliding_window": 23, "query_pre_attn_scalar": 96,
                "attn_logit_softcapping": 40.0}),
    ("gemma2", {"num_hidden_layers": 3, "sliding_window": 4096, "attn_logit_softcapping": None}),
    ("gemma3_text", {"num_hidden_layers": 13, "sliding_window": 41, "query_pre_attn_scalar": 80}),
]  # fmt: skip
#: Small sizes, so the model builds in a moment on a CPU.
GEMMA_SIZE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 512}  # fmt: skip


def _gemma_dir(tmp_path: Path, model_type: str, settings: dict) -> Path:
    from tests.conftest import write_transformers_config

    return write_transformers_config(tmp_path / model_type, model_type, **GEMMA_SIZE, **settings)


def _built(model_dir: Path, *flags: str) -> dict:
    """``own_attention_probe``'s facts of the model NeMo-RL's path builds from ``model_dir`` (its own process)."""
    return module_json("tests.real_nemo_rl.own_attention_probe", str(model_dir), *flags, timeout=600)


def _layout(layers: list[dict]) -> list[tuple]:
    return [(layer["window"], pytest.approx(layer["softmax_scale"], rel=1e-7), layer["softcap"]) for layer in layers]


def _predicted(model_dir: Path):
    """Both sides of the preview's reading of ``model_dir`` (the committed table's rules)."""
    from nemo_rl_attn_align.model.model_facts import read_model_facts

    facts = read_model_facts(str(model_dir))
    assert "its own attention modules" in facts.training.source, facts.training
    return facts.training, facts.rollout


@pytest.mark.parametrize(("model_type", "settings"), GEMMA_CASES)
def test_gemmas_per_layer_layout_in_the_table_is_what_the_providers_modules_hold(tmp_path, model_type, settings):
    model = _gemma_dir(tmp_path, model_type, settings)
    built = _built(model)["layers"]
    training, rollout = _predicted(model)
    assert [(k.window, k.softmax_scale, k.softcap) for k in training.per_layer()] == _layout(built)
    assert [k.window for k in rollout.per_layer()] == [layer["window"] for layer in built]  # vLLM agrees
    window, layers = settings["sliding_window"] - 1, settings["num_hidden_layers"]
    if model_type == "gemma2":  # odd one-based layers slide, as HF's layer_types say
        assert [layer["window"] for layer in built] == [window if i % 2 == 0 else None for i in range(layers)]
        assert {layer["softcap"] for layer in built} == {settings["attn_logit_softcapping"] or 0.0}
    else:  # every sixth one-based layer is global
        assert [layer["window"] for layer in built] == [None if (i + 1) % 6 == 0 else window for i in range(layers)]
    scalar = settings.get("query_pre_attn_scalar", 256)
    assert all(layer["softmax_scale"] == pytest.approx(scalar**-0.5) for layer in built)


def test_gemma2s_layer_kinds_inverted_by_the_4875_revert_show_against_the_table_and_in_the_reader(tmp_path):
    from nemo_rl_attn_align.model.model_attention import megatron_model

    settings = GEMMA_CASES[0][1]
    model = _gemma_dir(tmp_path, "gemma2", settings)
    reverted = _built(model, "--before-4875")
    training, rollout = _predicted(model)
    window = settings["sliding_window"] - 1
    predicted = [k.window for k in training.per_layer()]
    assert predicted == [k.window for k in rollout.per_layer()] == [window, None, window, None, window, None, window]
    built = [layer["window"] for layer in reverted["layers"]]
    assert built == [None if w is not None else window for w in predicted]  # every layer the other kind
    reading = reverted["reader"]  # what a table generated from such a release would carry
    buggy = megatron_model(reading["attributes"], "Megatron-Bridge", "read there", reading["layers"])
    assert [k.window for k in buggy.per_layer()] == built
