"""The recipe facts: one read of a resolved config (a packaged recipe through the real loader, and
odd values of each section) into what the rules, the preview and drift consume."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.model.model_config import ConfigNotRead, HFModelConfig
from nemo_rl_attn_align.preflight.facts import UNSET, Fact, read_policy_facts
from nemo_rl_attn_align.preflight.generation_facts import GenerationFacts
from nemo_rl_attn_align.preflight.recipe_facts import LocalFiles, RecipeFacts, read_recipe_facts
from nemo_rl_attn_align.preflight.tokenizer import TokenizerIdentity
from nemo_rl_attn_align.vocab.errors import UsageError
from tests.conftest import EXAMPLES


def test_a_packaged_recipe_reads_into_facts_with_their_keys():
    cfg = load_config(
        EXAMPLES / "grpo_math_1B_megatron_flash.yaml",
        ["policy.generation.vllm_cfg.tensor_parallel_size=2", "++policy.megatron_cfg.env_vars.A=1"],
    )
    facts = read_recipe_facts(cfg, {"NVTE_FLASH_ATTN": "1"})
    policy = facts.require_policy()
    assert policy.megatron_enabled and policy.backend == "flash" and policy.precision == "bfloat16"
    assert policy.tensor_parallel_size.key == "policy.megatron_cfg.tensor_model_parallel_size"
    assert policy.tensor_parallel_size.value == cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"]
    assert policy.env_vars["A"] == "1" and policy.nvte_env == {"NVTE_FLASH_ATTN": ("1", "environment NVTE_FLASH_ATTN")}
    gen = facts.generation
    assert gen.is_vllm and gen.tensor_parallel_size == Fact(2, "policy.generation.vllm_cfg.tensor_parallel_size")
    assert gen.precision == Fact(
        cfg["policy"]["generation"]["vllm_cfg"]["precision"], "policy.generation.vllm_cfg.precision"
    )
    assert facts.files.model_name == cfg["policy"]["model_name"]
    grpo = cfg["grpo"]
    assert facts.rollout_batch_size == grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"]
    assert facts.shape.seq_len == Fact(cfg["policy"]["max_total_sequence_length"], "policy.max_total_sequence_length")


def test_facts_are_frozen():
    facts = read_recipe_facts({"policy": {"model_name": "m"}}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.rollout_batch_size = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.generation.backend = "vllm"  # type: ignore[misc]


@pytest.mark.parametrize("policy", [None, "policy", 3, ["a"]])
def test_a_policy_that_is_not_a_mapping_is_reported_when_required(policy):
    facts = read_recipe_facts({"policy": policy}, {})
    assert facts.policy is None and not facts.megatron_enabled and facts.generation == GenerationFacts()
    with pytest.raises(UsageError, match=f"policy is {type(policy).__name__}, not a mapping"):
        facts.require_policy()
    with pytest.raises(UsageError, match=f"policy is {type(policy).__name__}, not a mapping"):
        read_policy_facts(policy, {})


@pytest.mark.parametrize("cfg", [None, {}, [], "x"])
def test_a_config_that_is_no_mapping_reads_as_empty(cfg):
    facts = read_recipe_facts(cfg, {})
    not_set = ConfigNotRead("policy.model_name is not set, so no config.json was looked for", missing=True)
    no_files = LocalFiles(None, not_set, None, TokenizerIdentity(None, "no tokenizer name"))
    assert facts == RecipeFacts(None, GenerationFacts(), facts.shape, no_files)
    assert facts.shape.layers == () and facts.shape.seq_len is None


@pytest.mark.parametrize("megatron_cfg", [None, "flash", 1, [], {"enabled": 0}])
def test_megatron_off_or_malformed_keeps_the_raw_value_and_defaults(megatron_cfg):
    policy = read_policy_facts({"megatron_cfg": megatron_cfg}, {})
    assert not policy.megatron_enabled and policy.megatron_cfg_raw == megatron_cfg
    assert policy.has_megatron_cfg is isinstance(megatron_cfg, dict)
    assert (policy.tensor_parallel_size.value, policy.apply_rope_fusion, policy.env_vars) == (1, True, {})
    assert policy.backend_raw is UNSET and policy.effective_backend == "auto"


@pytest.mark.parametrize("value,expected", [("yes", True), ("false", True), (1, True), (0, False), (None, False)])
def test_megatron_enabled_is_read_by_truthiness_as_nemo_rl_does(value, expected):
    policy = read_policy_facts({"megatron_cfg": {"enabled": value}}, {})
    assert policy.megatron_enabled is expected and policy.enabled_raw == value


def test_odd_megatron_values_keep_what_was_written():
    mcfg = {
        "enabled": True,
        "attention_backend": "Flash",
        "context_parallel_size": "2",
        "transformer_impl": "TE",
        "tensor_model_parallel_size": None,
        "apply_rope_fusion": "no",
        "model_overrides": "oops",
        "env_vars": ["NVTE_FLASH_ATTN=1"],
    }
    policy = read_policy_facts({"megatron_cfg": mcfg, "logprob_batch_size": True, "train_micro_batch_size": 4}, {})
    assert (policy.backend_raw, policy.backend, policy.effective_backend) == ("Flash", None, None)
    assert policy.context_parallel_size == 1
    counts = {fact.key: fact.value for fact in policy.counts}
    assert counts["policy.megatron_cfg.context_parallel_size"] == "2" and counts["policy.logprob_batch_size"] is True
    assert (policy.transformer_impl, policy.transformer_impl_raw) == ("transformer_engine", "TE")
    assert policy.tensor_parallel_size.value is None  # present and null: the engine's default, not NeMo-RL's 1
    assert policy.apply_rope_fusion is True  # True is no batch size: the next key is read, and named
    assert policy.physical_batch == Fact(4, "policy.train_micro_batch_size")
    assert read_policy_facts({"logprob_batch_size": 2}, {}).physical_batch == Fact(2, "policy.logprob_batch_size")
    assert read_policy_facts({}, {}).physical_batch == Fact(None, "policy.logprob_batch_size")
    assert policy.model_overrides == {} and policy.model_overrides_raw == "oops"
    assert policy.env_vars == {} and policy.nvte_env == {} and policy.env_vars_raw == ["NVTE_FLASH_ATTN=1"]
    # the provider gets what was written (the rules report it), never a malformed model_overrides
    assert policy.provider_settings == {
        "attention_backend": "Flash",
        "apply_rope_fusion": "no",
        "transformer_impl": "TE",
    }


def test_the_provider_settings_are_the_written_keys_then_the_model_overrides():
    mcfg = {
        "enabled": True,
        "attention_backend": None,
        "layernorm_epsilon": 1e-5,
        "bias_activation_fusion": False,
        "model_overrides": {"layernorm_epsilon": 1e-6, "rotary_base": 5000},
    }
    policy = read_policy_facts({"megatron_cfg": mcfg, "hf_config_overrides": {"rope_theta": 5}}, {})
    assert policy.provider_settings == {"layernorm_epsilon": 1e-6, "bias_activation_fusion": False, "rotary_base": 5000}
    assert policy.hf_config_overrides == {"rope_theta": 5}
    assert read_policy_facts({"hf_config_overrides": ["rope_theta"]}, {}).hf_config_overrides == {}
    assert read_policy_facts({"megatron_cfg": "x"}, {}).provider_settings == {}


def test_env_vars_overlay_the_environment_for_nvte_and_are_strings_for_the_worker():
    mcfg = {"enabled": True, "env_vars": {"NVTE_FUSED_ATTN": 0, "NVTE_FLASH_ATTN": None, "N": 2}}
    policy = read_policy_facts({"megatron_cfg": mcfg}, {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1"})
    assert policy.nvte_env == {
        "NVTE_FUSED_ATTN": ("0", "policy.megatron_cfg.env_vars.NVTE_FUSED_ATTN"),
        "NVTE_FLASH_ATTN": ("1", "environment NVTE_FLASH_ATTN"),
    }
    assert policy.env_vars == {"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN": "None", "N": "2"}


@pytest.mark.parametrize("generation", [None, "vllm", 5, {"backend": "hf"}])
def test_generation_that_is_not_vllm(generation):
    gen = read_recipe_facts({"policy": {"generation": generation}}, {}).generation
    assert not gen.is_vllm
    if not isinstance(generation, dict):
        assert gen == GenerationFacts()


def test_generation_values_as_written_or_the_engine_default():
    cfg = {
        "policy": {
            "precision": "bfloat16",
            "generation": {
                "backend": "vllm",
                "vllm_cfg": {"kv_cache_dtype": None, "enable_prefix_caching": "on", "env_vars": {"X": 1}},
                "vllm_kwargs": {"block_size": 32, "enable_chunked_prefill": False, "max_num_seqs": 8},
            },
        }
    }
    gen = read_recipe_facts(cfg, {}).generation
    assert gen.precision == Fact("bfloat16", "policy.precision")  # vllm_cfg.precision absent
    cfg["policy"]["generation"]["vllm_cfg"]["precision"] = "fp8"
    assert read_recipe_facts(cfg, {}).generation.precision == Fact("fp8", "policy.generation.vllm_cfg.precision")
    assert gen.kv_cache_dtype == Fact(None, "policy.generation.vllm_cfg.kv_cache_dtype")
    assert gen.enable_prefix_caching.value == "on" and gen.tensor_parallel_size.value == 1
    assert (gen.block_size, gen.enable_chunked_prefill, gen.max_num_seqs, gen.attention_backend) == (32, False, 8, None)
    assert gen.env_vars == {"X": "1"} and gen.max_model_len is None
    cfg["policy"]["generation"]["vllm_cfg"]["max_model_len"] = 512
    assert read_recipe_facts(cfg, {}).generation.max_model_len == 512
    odd = {"policy": {"generation": {"backend": "vllm", "vllm_cfg": "x", "vllm_kwargs": 3}}}
    gen = read_recipe_facts(odd, {}).generation
    assert gen.is_vllm and gen.kv_cache_dtype.value == "auto" and gen.enable_chunked_prefill is True
    assert gen.precision == Fact(None, "policy.precision") and gen.env_vars == {}


def test_the_shape_layer_is_the_drift_block_and_the_model_carries_the_overrides():
    cfg = {
        "attention_align": {"drift": {"heads": 4}},
        "policy": {
            "model_name": "Qwen/Qwen3-8B",
            "megatron_cfg": {"model_overrides": {"num_query_groups": 2, "window_size": [127, 0]}},
            "hf_config_overrides": {"head_dim": 64},
        },
    }
    facts = read_recipe_facts(cfg, {})
    assert [(layer.key, layer.value) for layer in facts.shape.layers] == [("attention_align.drift", {"heads": 4})]
    (kind,) = facts.model.training.kinds
    assert (kind.kv_heads, kind.window, kind.head_dim_qk) == (2, 127, 64)
    assert facts.model.applied == {"num_query_groups": 2, "window_size": [127, 0]}
    (rollout,) = facts.model.rollout.kinds  # vLLM reads the config without Megatron's overrides
    assert (rollout.kv_heads, rollout.window, rollout.head_dim_qk) == (8, None, 128)


def test_shape_sections_that_are_not_dicts_are_no_layers():
    cfg = {
        "attention_align": {"drift": "big"},
        "policy": {"megatron_cfg": {"model_overrides": [1]}, "hf_config_overrides": None},
    }
    assert read_recipe_facts(cfg, {}).shape.layers == ()


def test_the_softmax_comes_from_the_model_never_from_its_name(tmp_path):
    from tests.conftest import write_transformers_config

    sinks = write_transformers_config(tmp_path / "results" / "step_100" / "hf", "gpt_oss", num_hidden_layers=2)
    assert read_recipe_facts({"policy": {"model_name": str(sinks)}}, {}).policy.softmax_type.value == "learnable"
    named = read_recipe_facts({"policy": {"model_name": "acme/gpt-oss-120b-look-alike"}}, {}).policy.softmax_type
    assert named.value == "vanilla" and "not known here" in named.key


def test_tokenizer_and_batch_size_fall_back_or_stay_unset():
    facts = read_recipe_facts(
        {
            "policy": {"model_name": "m", "tokenizer": {"name": ""}},
            "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": True},
        },
        {},
    )
    assert facts.files.tokenizer_name == "m" and facts.rollout_batch_size is None
    assert facts.files.tokenizer == TokenizerIdentity("m", "compared by name (not a local directory)")


def test_a_second_reading_keeps_the_files_the_first_read():
    first = read_recipe_facts({"policy": {"model_name": "Qwen/Qwen3-8B"}}, {})
    assert isinstance(first.files.model_config, HFModelConfig)  # the test session's Hugging Face cache
    again = read_recipe_facts({"policy": {"model_name": "Qwen/Qwen3-8B", "precision": "float16"}}, {}, first.files)
    assert again.files is first.files and again.require_policy().precision == "float16"
    other = read_recipe_facts({"policy": {"model_name": "m"}}, {}, first.files)
    assert other.files.model_name == "m" and other.files.model_config.missing


def test_the_facts_module_imports_only_stdlib_and_plugin_leaves():
    code = (
        "import sys\nimport nemo_rl_attn_align.preflight.facts\n"
        "print(' '.join(m for m in ('torch', 'omegaconf', 'yaml', 'megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
