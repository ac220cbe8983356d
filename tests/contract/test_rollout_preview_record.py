"""The rollout preview reports what the vLLM record will: the tokenizer by content where its files are
local, the KV-cache format by the record's rule (``auto``: the model dtype, ``fp8``: ``fp8_e4m3``).
The same against a real engine's record: ``tests/real_vllm/test_record_gaps.py``."""

from __future__ import annotations

import json

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.contract_preview import predict_rollout, predict_training
from nemo_rl_attn_align.contract.rollout import rollout_contract
from nemo_rl_attn_align.contract.vllm_snapshot import VllmSnapshot
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.preflight.tokenizer import tokenizer_identity
from tests.conftest import EXAMPLES

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
KV = "++policy.generation.vllm_cfg.kv_cache_dtype"


def _rollout(*overrides):
    return predict_rollout(read_recipe_facts(load_config(GRPO, list(overrides)), {}), {})


def test_a_local_tokenizer_is_previewed_by_its_content_as_both_records_name_it(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    rollout = _rollout(f"policy.tokenizer.name={tmp_path}")
    training = predict_training(read_recipe_facts(load_config(GRPO, [f"policy.tokenizer.name={tmp_path}"]), {}))
    expected, how, _ = tokenizer_identity(str(tmp_path))
    assert expected.startswith("sha256:")
    record = rollout_contract(VllmSnapshot(tokenizer=str(tmp_path)), "vllm-rank0-worker0")
    for contract in (rollout, training):
        assert contract.value("tokenizer") == expected == record.value("tokenizer")
        assert contract["tokenizer"].provenance.value == "configured" and how in contract["tokenizer"].source
    hub = _rollout("policy.tokenizer.name=meta-llama/Llama-3.2-1B-Instruct")  # not on this machine: by name
    assert hub.value("tokenizer") == "meta-llama/Llama-3.2-1B-Instruct"
    assert "compared by name" in hub["tokenizer"].source


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "bf16"),  # the example's kv_cache_dtype auto, vllm_cfg.precision bfloat16: the model dtype
        (["policy.generation.vllm_cfg.precision=float16"], "fp16"),
        ([f"{KV}=fp8"], "fp8_e4m3"),
        ([f"{KV}=fp8_e4m3"], "fp8_e4m3"),
        ([f"{KV}=fp8_e5m2"], "fp8_e5m2"),
        ([f"{KV}=bfloat16"], "bf16"),
    ],
)
def test_the_kv_cache_format_is_previewed_by_the_records_rule(overrides, expected):
    contract = _rollout(*overrides)
    assert contract.value("kv_cache_dtype") == expected
    assert contract["kv_cache_dtype"].provenance.value == "configured"
    assert contract["kv_cache_dtype"].source.startswith("policy.generation.vllm_cfg.kv_cache_dtype")
    cache_dtype = load_config(GRPO, overrides)["policy"]["generation"]["vllm_cfg"]["kv_cache_dtype"]
    recorded = rollout_contract(
        VllmSnapshot(
            kv_cache_dtype=cache_dtype, dtype=contract.value("dtype"), layer_kv_cache_dtypes={"l0": cache_dtype}
        ),
        "w",
    )
    assert recorded.value("kv_cache_dtype") == expected


def test_a_quantized_checkpoint_leaves_auto_to_the_engine(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4, "quantization_config": {"x": 1}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    contract = _rollout(f"policy.model_name={tmp_path}")
    assert contract["kv_cache_dtype"].provenance.value == "pending"
    assert "quantization_config" in contract["kv_cache_dtype"].source
    unknown = _rollout("policy.generation.vllm_cfg.precision=null")
    assert unknown["kv_cache_dtype"].provenance.value == "pending"  # auto, and the model dtype is not known
