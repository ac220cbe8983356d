"""``check --gpu`` on every architecture the architecture table holds: each layer kind's kernel on both
sides, from the model's own config.json (made with transformers' own config classes), never its name."""

from __future__ import annotations

import importlib.util

import pytest

from nemo_rl_attn_align.cli.check import evaluate
from nemo_rl_attn_align.kernels.kernel_query import KernelOptions
from nemo_rl_attn_align.model import architectures
from tests.conftest import EXAMPLES, REPO, write_transformers_config

transformers = pytest.importorskip("transformers", reason="the test models are made with transformers' classes")

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
TABLE = architectures.load()


def _generator():
    spec = importlib.util.spec_from_file_location("generator", REPO / "scripts" / "update_architecture_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE_MODEL_TYPES = sorted(_generator().RECIPE_ARCHITECTURES)


def _model(tmp_path, model_type: str, folder: str = "results/step_100/hf", **kwargs):
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto

    config = AutoConfig.for_model(model_type, **kwargs)
    wanted = {e["model_type"]: a for side in architectures.SIDES for a, e in TABLE[side]["architectures"].items()}
    config.architectures = [wanted.get(model_type) or modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    config.save_pretrained(tmp_path / folder)
    return tmp_path / folder


def _check(model, *overrides: str, gpu: str = "sm90") -> dict:
    return evaluate(
        GRPO,
        [f"policy.model_name={model}", "policy.tokenizer.name=null", *overrides],
        environ={},
        kernel_options=KernelOptions(gpu=gpu),
    )


def test_gpt_oss_under_flash_stops_with_tes_reason_in_a_directory_of_any_name(tmp_path):
    model = write_transformers_config(tmp_path / "results" / "step_100" / "hf", "gpt_oss", num_hidden_layers=4)
    result = _check(model, gpu="sm90")
    assert result["exit_code"] == 1
    kinds = result["kernels"]["training"]
    assert [k["layers"].split(" (")[0] for k in kinds] == ["layers 0,2", "layers 1,3"]
    assert all(k["kernel"] is None and k["query"]["softmax"] == "learnable" for k in kinds)
    assert kinds[0]["query"]["window"] == 127 and kinds[1]["query"]["window"] is None
    findings = [f for f in result["kernels"]["findings"] if f["code"] == "TE_NO_BACKEND"]
    te_says = "Disabling FlashAttention for softmax_type = learnable"
    assert len(findings) == 2 and all(te_says in f["message"] for f in findings)
    assert "attention_backend=fused runs FusedAttention" in findings[0]["fix"]
    assert [f["code"] for f in result["plan"]["findings"]] == ["FLASH_UNSUPPORTED_SOFTMAX"]
    rollout = result["kernels"]["rollout"]
    assert all(k["query"]["has_sink"] for k in rollout)
    assert [k["query"]["sliding_window"] for k in rollout] == [True, False]
    fused = _check(model, "policy.megatron_cfg.attention_backend=fused", gpu="sm90")
    assert all(k["label"].startswith("FusedAttention") for k in fused["kernels"]["training"])


MLA_CASES = [
    ("sm90", [], "FLASH_ATTN_MLA"),
    ("sm100", [], "TRITON_MLA"),  # the example's aligned preset: vLLM's batch-invariant MLA backends only
    ("sm100", ["attention_align.preset=null"], "FLASHINFER_MLA"),
]


@pytest.mark.parametrize(("gpu", "overrides", "mla_backend"), MLA_CASES)
def test_a_deepseek_v3_style_mla_config_names_an_mla_rollout_backend_and_tes_answer_for_192_128(
    tmp_path, gpu, overrides, mla_backend
):
    model = _model(tmp_path, "deepseek_v3", num_hidden_layers=4)
    kernels = _check(model, *overrides, gpu=gpu)["kernels"]
    (training,) = kernels["training"]
    assert (training["query"]["head_dim_qk"], training["query"]["head_dim_v"]) == (192, 128)
    assert training["pending"] is None and training["label"]
    (rollout,) = kernels["rollout"]
    assert rollout["query"]["use_mla"] and rollout["query"]["head_size"] == 576 and rollout["kernel"] == mla_backend


@pytest.mark.parametrize("gpu", ["sm90", "sm100"])
@pytest.mark.parametrize("model_type", RECIPE_MODEL_TYPES)
def test_every_recipe_architecture_gets_a_kernel_or_a_stop_on_both_sides_never_pending(tmp_path, model_type, gpu):
    model = _model(tmp_path, model_type)
    result = _check(model, gpu=gpu)
    kernels = result["kernels"]
    for side in ("training", "rollout"):
        assert kernels[side], (side, kernels["notes"])
        for kind in kernels[side]:
            assert kind["pending"] is None, (side, kind["layers"], kind["pending"])
    stops = {f["code"] for f in kernels["findings"]}
    no_kernel = [k for side in ("training", "rollout") for k in kernels[side] if k["kernel"] is None]
    assert bool(no_kernel) == bool(stops & {"TE_NO_BACKEND", "VLLM_NO_BACKEND"})


def test_a_provider_that_lays_out_its_own_layers_unread_is_not_understood_with_the_reason(tmp_path, monkeypatch):
    training = TABLE["training"]["architectures"]
    unread = {k: v for k, v in training["Gemma3ForCausalLM"].items() if k != "layers"}
    without = {**TABLE, "training": {**TABLE["training"], "architectures": {**training, "Gemma3ForCausalLM": unread}}}
    monkeypatch.setattr(architectures, "load", lambda: without)
    (training,) = _check(_model(tmp_path, "gemma3_text"))["kernels"]["training"]
    assert "Gemma3ModelProvider builds its layers with its own interleaved_attn_pattern" in training["pending"]


#: Gemma 2 and 3 at sizes no sampled config had: every other layer windowed (Gemma 2), every sixth
#: one-based layer global (Gemma 3), a scale of their own (query_pre_attn_scalar), Gemma 2's soft cap.
GEMMA = {
    "gemma2": ({"attn_logit_softcapping": 30.0}, [511 if i % 2 == 0 else None for i in range(8)], 30.0),
    "gemma3_text": ({}, [None if (i + 1) % 6 == 0 else 511 for i in range(8)], None),
}
IDENTITY_FIELDS = ("layer_windows", "sliding_window", "logit_softcapping", "softmax_scale")


@pytest.mark.parametrize("model_type", sorted(GEMMA))
def test_gemma_is_read_per_layer_on_both_sides_and_the_preview_binds_the_two_readings(tmp_path, model_type):
    from nemo_rl_attn_align.cli.check_text import render_text

    settings, windows, cap = GEMMA[model_type]
    model = _model(tmp_path, model_type, num_hidden_layers=8, sliding_window=512, query_pre_attn_scalar=144,
                   **settings)  # fmt: skip
    result = _check(model, gpu="sm90")
    read = result["kernels"]["model"]
    for side in ("training", "rollout"):
        per_layer = {i: kind for kind in read[side]["kinds"] for i in kind["layers"]}
        assert [per_layer[i]["window"] for i in range(8)] == windows, side
        assert [kind["softmax_scale"] for kind in read[side]["kinds"]] == [pytest.approx(144**-0.5, rel=1e-7)] * 2
        assert {kind["softcap"] for kind in read[side]["kinds"]} == {cap or 0.0}, side
    assert "its own attention modules" in read["training"]["source"]
    fields = {f["field"]: f for f in result["attention_align"]["binding"]["fields"]}
    for name in IDENTITY_FIELDS:
        assert fields[name]["status"] == "match", fields[name]
        assert fields[name]["training"]["source"].startswith("Megatron-Bridge's reading of"), name
        assert fields[name]["rollout"]["source"].startswith("vLLM's reading of"), name
    assert fields["layer_windows"]["training"]["value"] == windows
    assert fields["logit_softcapping"]["training"]["value"] == cap
    assert fields["softmax_scale"]["training"]["value"] == pytest.approx(144**-0.5, rel=1e-7)
    layouts = [line.strip() for line in render_text(result).splitlines() if line.startswith("      layers")]
    assert len(layouts) == 4 and layouts[:2] == layouts[2:]  # two kinds, each side's, the same
    assert all(line.endswith(f"{', logit soft cap 30' if cap else ''}, scale 0.0833333") for line in layouts)
    (kernel, *_) = result["kernels"]["training"]
    assert kernel["label"] == ("Gemma2FlexDotProductAttention" if model_type == "gemma2" else "FlashAttention 2.8.3")


def test_a_gemma3_config_whose_layer_types_megatron_bridge_ignores_is_a_layer_windows_mismatch(tmp_path):
    types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(8)]
    model = _model(tmp_path, "gemma3_text", num_hidden_layers=8, sliding_window=512, layer_types=types)
    fields = {f["field"]: f for f in _check(model)["attention_align"]["binding"]["fields"]}
    windows = fields["layer_windows"]
    assert windows["status"] == "mismatch" and windows["code"] == "ATTN_IDENTITY_MISMATCH"
    assert windows["training"]["value"] == [None if (i + 1) % 6 == 0 else 511 for i in range(8)]  # (5, 1), always
    assert windows["rollout"]["value"] == [None if t == "full_attention" else 511 for t in types]  # layer_types


def test_a_model_not_on_this_machine_says_which_file_was_looked_for_and_how_to_fetch_it():
    result = evaluate(GRPO, ["policy.model_name=acme/absent-8B"], environ={}, kernel_options=KernelOptions(gpu="sm90"))
    (training,) = result["kernels"]["training"]
    assert "hf download acme/absent-8B config.json" in training["pending"]
    assert result["kernels"]["model"]["not_found"].startswith("policy.model_name='acme/absent-8B': no config.json")
    assert result["exit_code"] == 0
