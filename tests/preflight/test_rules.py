"""Every rule code, triggered and not triggered, on resolved policy configs."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.preflight.facts import MEGATRON_INDEXED_KEYS, read_policy_facts
from nemo_rl_attn_align.preflight.plan import build_plan, build_plan_for_policy
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.preflight.rules.registry import RULES, rule
from nemo_rl_attn_align.vocab.codes import Code, Kind, codes_of
from nemo_rl_attn_align.vocab.errors import RuleViolation, Severity, UsageError
from tests.conftest import EXAMPLES

BASE = load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")["policy"]
DELETE = object()


def policy(**changes):
    """The example's policy with dotted keys (``__`` for ``.``) set, or deleted with DELETE."""
    cfg = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = cfg
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return cfg


def codes(policy_cfg, environ=None):
    return [f.code for f in build_plan_for_policy(policy_cfg, environ or {}).findings]


# (code, config that triggers it, environ, a near-miss config that must not trigger it, its environ)
CASES = [
    (
        Code.VLLM_KWARG_PASSED_TWICE,
        policy(generation__vllm_kwargs__seed=1),
        {},
        policy(generation__vllm_kwargs__block_size=16),
        {},
    ),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__context_parallel_size="2"),
        {},
        policy(megatron_cfg__context_parallel_size=2),
        {},
    ),
    (Code.CONFIG_VALUE_INVALID, policy(megatron_cfg__context_parallel_size=2.0), {}, policy(), {}),
    (Code.CONFIG_VALUE_INVALID, policy(megatron_cfg__context_parallel_size=0), {}, policy(), {}),
    (Code.CONFIG_VALUE_INVALID, policy(megatron_cfg__context_parallel_size=True), {}, policy(), {}),
    (Code.CONFIG_VALUE_INVALID, policy(megatron_cfg__tensor_model_parallel_size=True), {}, policy(), {}),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__pipeline_model_parallel_size="2"),
        {},
        policy(megatron_cfg__pipeline_model_parallel_size=2),
        {},
    ),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(generation__vllm_cfg__tensor_parallel_size=True),
        {},
        policy(generation__vllm_cfg__tensor_parallel_size=True, generation__backend="megatron"),
        {},
    ),
    (
        Code.NUMBER_IS_BOOLEAN,
        policy(generation__vllm_kwargs__max_num_seqs=True),
        {},
        policy(generation__vllm_kwargs__max_num_seqs=1),
        {},
    ),
    (Code.NUMBER_IS_BOOLEAN, policy(max_total_sequence_length=False), {}, policy(), {}),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__transformer_impl="TE"),
        {},
        policy(megatron_cfg__transformer_impl="transformer_engine"),
        {},
    ),
    (Code.CONFIG_VALUE_INVALID, {**BASE, "megatron_cfg": "flash"}, {}, policy(), {}),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__model_overrides="oops"),
        {},
        policy(megatron_cfg__model_overrides=None),
        {},
    ),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__env_vars=["NVTE_FLASH_ATTN=1"]),
        {},
        policy(megatron_cfg__env_vars={}),
        {},
    ),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__model_overrides={"softmax_type": "sinks"}),
        {},
        policy(megatron_cfg__model_overrides={"softmax_type": "off-by-one"}),
        {},
    ),
    (
        Code.CONFIG_VALUE_INVALID,
        policy(megatron_cfg__context_parallel_size=2, megatron_cfg__model_overrides={"cp_comm_type": "ring"}),
        {},
        policy(megatron_cfg__context_parallel_size=2, megatron_cfg__model_overrides={"cp_comm_type": ["p2p", "a2a"]}),
        {},
    ),
    (Code.CONFIG_VALUE_INVALID, policy(model_name=7), {}, policy(model_name="Qwen/Qwen3-8B"), {}),
    (
        Code.FLAG_NOT_BOOLEAN,
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": 1}),
        {},
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True}),
        {},
    ),
    (Code.ATTN_BACKEND_INVALID, policy(megatron_cfg__attention_backend="Flash"), {}, policy(), {}),
    (
        Code.ATTN_BACKEND_NULL,
        policy(megatron_cfg__attention_backend=None),
        {},
        policy(megatron_cfg__attention_backend=DELETE),
        {},
    ),
    (Code.PRECISION_INVALID, policy(precision="bf16"), {}, policy(precision="float16"), {}),
    (Code.PRECISION_INVALID, policy(megatron_cfg__pipeline_dtype="half"), {}, policy(), {}),
    (
        Code.FLASH_REQUIRES_HALF_PRECISION,
        policy(precision="float32", megatron_cfg__pipeline_dtype="float32"),
        {},
        policy(precision="float16", megatron_cfg__pipeline_dtype="float16"),
        {},
    ),
    (
        Code.FUSED_REQUIRES_HALF_PRECISION,
        policy(precision="float32", megatron_cfg__pipeline_dtype="float32", megatron_cfg__attention_backend="fused"),
        {},
        policy(precision="float32", megatron_cfg__pipeline_dtype="float32", megatron_cfg__attention_backend="unfused"),
        {},
    ),
    (
        Code.PRECISION_OVERRIDE_IGNORED,
        policy(megatron_cfg__model_overrides={"params_dtype": "float32"}),
        {},
        policy(megatron_cfg__model_overrides={"num_layers": 2}),
        {},
    ),
    (
        Code.LOCAL_REQUIRES_LOCAL_SPEC,
        policy(megatron_cfg__attention_backend="local"),
        {},
        policy(megatron_cfg__attention_backend="local", megatron_cfg__transformer_impl="local"),
        {},
    ),
    (
        Code.LOCAL_NO_CONTEXT_PARALLEL,
        policy(
            megatron_cfg__attention_backend="local",
            megatron_cfg__transformer_impl="local",
            megatron_cfg__context_parallel_size=2,
        ),
        {},
        policy(megatron_cfg__attention_backend="flash", megatron_cfg__context_parallel_size=2),
        {},
    ),
    (
        Code.LOCAL_NO_CONTEXT_PARALLEL,
        policy(
            megatron_cfg__attention_backend=DELETE,
            megatron_cfg__transformer_impl="local",
            megatron_cfg__context_parallel_size=2,
        ),
        {},
        policy(megatron_cfg__attention_backend=DELETE, megatron_cfg__transformer_impl="local"),
        {},
    ),
    (
        Code.BACKEND_IGNORED_BY_LOCAL_SPEC,
        policy(megatron_cfg__transformer_impl="local"),
        {},
        policy(megatron_cfg__attention_backend="local", megatron_cfg__transformer_impl="local"),
        {},
    ),
    (
        Code.UNFUSED_NO_CONTEXT_PARALLEL,
        policy(megatron_cfg__attention_backend="unfused", megatron_cfg__context_parallel_size=2),
        {},
        policy(megatron_cfg__attention_backend="unfused", megatron_cfg__context_parallel_size=1),
        {},
    ),
    (
        Code.FP32_CONTEXT_PARALLEL_NO_BACKEND,
        policy(
            precision="float32",
            megatron_cfg__pipeline_dtype="float32",
            megatron_cfg__attention_backend="auto",
            megatron_cfg__context_parallel_size=4,
        ),
        {},
        policy(precision="bfloat16", megatron_cfg__attention_backend="auto", megatron_cfg__context_parallel_size=4),
        {},
    ),
    (
        Code.FLASH_UNSUPPORTED_SOFTMAX,
        policy(megatron_cfg__model_overrides={"softmax_type": "learnable"}),
        {},
        policy(megatron_cfg__model_overrides={"softmax_type": "vanilla"}),
        {},
    ),
    (
        Code.FLASH_UNSUPPORTED_SOFTMAX,
        policy(model_name="openai/gpt-oss-20b"),
        {},
        policy(model_name="openai/gpt-oss-20b", megatron_cfg__attention_backend="fused"),
        {},
    ),
    (
        Code.BATCH_INVARIANT_REQUIRES_FLASH,
        policy(megatron_cfg__attention_backend="fused", megatron_cfg__model_overrides={"batch_invariant_mode": True}),
        {},
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True}),
        {},
    ),
    (
        Code.BATCH_INVARIANT_REQUIRES_BF16,
        policy(
            precision="float16",
            megatron_cfg__pipeline_dtype="float16",
            megatron_cfg__model_overrides={"batch_invariant_mode": True},
        ),
        {},
        policy(
            precision="float16",
            megatron_cfg__pipeline_dtype="float16",
            megatron_cfg__model_overrides={"batch_invariant_mode": False},
        ),
        {},
    ),
    (
        Code.BATCH_INVARIANT_NO_CONTEXT_PARALLEL,
        policy(megatron_cfg__context_parallel_size=2, megatron_cfg__model_overrides={"batch_invariant_mode": True}),
        {},
        policy(megatron_cfg__context_parallel_size=2),
        {},
    ),
    (
        Code.BATCH_INVARIANT_REQUIRES_FLASH_VERSION,
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True, "flash_attention_version": 2}),
        {},
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True, "flash_attention_version": 3}),
        {},
    ),
    (
        Code.BATCH_INVARIANT_NO_ATTENTION_DROPOUT,
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True, "attention_dropout": 0.1}),
        {},
        policy(megatron_cfg__model_overrides={"batch_invariant_mode": True, "attention_dropout": 0.0}),
        {},
    ),
    (
        Code.GENERATION_ATTENTION_DIFFERS,
        policy(
            generation={
                "backend": "megatron",
                "colocated": {"enabled": False},
                "mcore_generation_config": {"model_overrides": {"deterministic_mode": True}},
            }
        ),
        {},
        policy(
            generation={
                "backend": "megatron",
                "colocated": {"enabled": False},
                "mcore_generation_config": {"block_size_tokens": 256},
            }
        ),
        {},
    ),
    (
        Code.MODEL_OVERRIDE_CONFLICT,
        policy(megatron_cfg__model_overrides={"attention_backend": "fused"}),
        {},
        policy(megatron_cfg__model_overrides={"hidden_dropout": 0.0}),
        {},
    ),
    (
        Code.NVTE_ENV_CONFLICT,
        policy(megatron_cfg__attention_backend=DELETE),
        {"NVTE_FLASH_ATTN": "0"},
        policy(megatron_cfg__attention_backend=DELETE),
        {"NVTE_FLASH_ATTN": "1"},
    ),
    (
        Code.NVTE_ENV_CONFLICT,
        policy(megatron_cfg__attention_backend=DELETE, megatron_cfg__env_vars={"NVTE_FUSED_ATTN": 0}),
        {},
        policy(megatron_cfg__attention_backend=DELETE, megatron_cfg__env_vars={"NVTE_FUSED_ATTN": "1"}),
        {},
    ),
    (Code.NVTE_ENV_DISCARDED, policy(), {"NVTE_FUSED_ATTN": "1"}, policy(), {"NVTE_FUSED_ATTN": "0"}),
    (
        Code.BACKEND_WITHOUT_MEGATRON,
        policy(megatron_cfg__enabled=False),
        {},
        policy(megatron_cfg__enabled=False, megatron_cfg__attention_backend=DELETE),
        {},
    ),
    *(
        (
            Code.MEGATRON_KEY_MISSING,
            policy(**{f"megatron_cfg__{key}": DELETE}),
            {},
            policy(**{f"megatron_cfg__{key}": DELETE, "megatron_cfg__enabled": False}),
            {},
        )
        for key, _ in MEGATRON_INDEXED_KEYS
    ),
]


@pytest.mark.parametrize(
    "code, bad, bad_env, good, good_env", CASES, ids=[f"{c[0].value}-{i}" for i, c in enumerate(CASES)]
)
def test_rule_triggers_and_near_miss_does_not(code, bad, bad_env, good, good_env):
    assert code.value in codes(bad, bad_env)
    assert code.value not in codes(good, good_env)


def test_every_code_has_a_case_a_summary_and_a_severity():
    assert {c[0] for c in CASES} == set(codes_of(Kind.RULE))
    for code in codes_of(Kind.RULE):
        assert code.summary and isinstance(code.severity, Severity)


def test_every_rule_code_is_declared_by_one_rule_and_the_rules_run_in_their_old_order():
    declared = [code for _, raised in RULES for code in raised]
    assert sorted(declared) == sorted(codes_of(Kind.RULE))
    # the order findings come out in (unchanged since the rules were a hand-written tuple)
    assert [check.__name__ for check, _ in RULES] == [
        "_config_values",
        "_indexed_keys",
        "_backend_value",
        "_precision_values",
        "_half_precision",
        "_precision_overrides",
        "_local_spec",
        "_context_parallel",
        "_softmax_type",
        "_batch_invariant",
        "_model_override_conflict",
        "_nvte_environment",
        "_without_megatron",
        "_batch_invariant_kernels",
        "_generation_attention",
        "_vllm_kwargs_passed_twice",
    ]


def test_a_rule_raises_only_the_codes_it_declares():
    raised_by = {check.__name__: set(raised) for check, raised in RULES}
    for _, bad, env, _, _ in CASES:
        facts = read_policy_facts(bad, env)
        for check, _ in RULES:
            assert {Code(f.code) for f in check(facts)} <= raised_by[check.__name__], check.__name__


@pytest.mark.parametrize(
    "codes_", [(), (Code.ATTN_SEMANTIC_MANDATE,), (Code.PRECISION_INVALID, Code.ALIGN_PRESET_REFUSED)]
)
def test_a_rule_must_declare_rule_codes(codes_):
    with pytest.raises(ValueError, match="a rule raises rule codes"):
        rule(*codes_)


def test_findings_name_key_value_and_fix():
    for code, bad, env, _, _ in CASES:
        for f in build_plan_for_policy(bad, env).findings:
            assert f.key and f.fix and f.message, code
            assert "\n" not in f.line()
            assert f.severity is Code(f.code).severity


def test_flash_fp32_names_precision_and_suggests_bfloat16():
    plan = build_plan_for_policy(policy(precision="float32", megatron_cfg__pipeline_dtype="float32"), {})
    [err] = plan.errors
    assert err.key == "policy.precision" and "bfloat16" in err.fix
    with pytest.raises(RuleViolation) as info:
        plan.raise_for_errors()
    assert info.value.findings == [err]


def test_stock_example_is_clean_and_plans_flash():
    plan = build_plan_for_policy(policy(), {})
    assert plan.ok and plan.findings == []
    assert plan.attn_backend == "AttnBackend.flash"
    assert plan.nvte == {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}


def test_unset_means_megatron_default_auto():
    plan = build_plan_for_policy(policy(megatron_cfg__attention_backend=DELETE), {})
    assert plan.requested is None and plan.effective == "auto" and plan.ok
    assert plan.to_dict()["source"].startswith("unset")


def test_warnings_alone_keep_the_plan_ok():
    plan = build_plan_for_policy(policy(megatron_cfg__attention_backend=None), {})
    assert plan.ok and [f.code for f in plan.warnings] == ["ATTN_BACKEND_NULL"]


def test_env_vars_take_precedence_over_the_environment():
    cfg = policy(megatron_cfg__attention_backend=DELETE, megatron_cfg__env_vars={"NVTE_FLASH_ATTN": "1"})
    plan = build_plan_for_policy(cfg, {"NVTE_FLASH_ATTN": "0"})
    assert plan.ok
    assert plan.nvte_existing["NVTE_FLASH_ATTN"] == ("1", "policy.megatron_cfg.env_vars.NVTE_FLASH_ATTN")


def test_fp32_with_the_local_spec_is_not_a_half_precision_error():
    """TE never runs with transformer_impl local, so flash + FP32 there is a warning, not an error."""
    cfg = policy(precision="float32", megatron_cfg__pipeline_dtype="float32", megatron_cfg__transformer_impl="local")
    plan = build_plan_for_policy(cfg, {})
    assert plan.ok and [f.code for f in plan.findings] == ["BACKEND_IGNORED_BY_LOCAL_SPEC"]


def test_fp16_flash_is_accepted():
    assert build_plan_for_policy(policy(precision="float16", megatron_cfg__pipeline_dtype="float16"), {}).ok


def test_build_plan_needs_a_policy_section():
    with pytest.raises(UsageError, match="policy"):
        build_plan(read_recipe_facts({"grpo": {}}))
    with pytest.raises(UsageError, match="policy"):
        build_plan(read_recipe_facts({"policy": "x"}))


@pytest.mark.parametrize("value, on", [(1, True), ("false", True), ("no", True), (0, False), ("", False), ([], False)])
def test_batch_invariant_mode_follows_megatron_truthiness(value, on):
    """Megatron's ``if config.batch_invariant_mode:`` decides; the checks follow it and say so."""
    found = codes(
        policy(megatron_cfg__attention_backend="fused", megatron_cfg__model_overrides={"batch_invariant_mode": value})
    )
    assert ("BATCH_INVARIANT_REQUIRES_FLASH" in found) is on
    assert "FLAG_NOT_BOOLEAN" in found


@pytest.mark.parametrize("cp", [1, 2, 8])
def test_usable_context_parallel_sizes_are_not_refused(cp):
    assert "CONFIG_VALUE_INVALID" not in codes(policy(megatron_cfg__context_parallel_size=cp))


@pytest.mark.parametrize("size", [True, False, 2.0, "2"])
def test_a_layout_size_the_host_cannot_reshape_by_is_refused(size):
    """NeMo-RL builds its workers' layout with ``np.arange(world_size).reshape(pp, -1, cp, tp)`` (and
    vLLM's with ``reshape(dp, pp, tp)``): numpy itself refuses anything but an integer there."""
    numpy = pytest.importorskip("numpy")
    with pytest.raises(TypeError):
        numpy.arange(8).reshape(1, -1, size, 1)
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        assert "CONFIG_VALUE_INVALID" in codes(policy(**{f"megatron_cfg__{key}": size}))


@pytest.mark.parametrize("key", [key for key, _ in MEGATRON_INDEXED_KEYS])
def test_a_key_nemo_rl_indexes_directly_is_an_error_naming_the_key_and_the_fix(key):
    plan = build_plan_for_policy(policy(**{f"megatron_cfg__{key}": DELETE}), {})
    [err] = plan.errors
    assert err.code == "MEGATRON_KEY_MISSING" and err.severity is Severity.ERROR
    assert err.key == f"policy.megatron_cfg.{key}"
    assert f"KeyError: '{key}'" in err.message and "lm_policy.py" in err.message
    assert f"add policy.megatron_cfg.{key}: 1" in err.fix and f"++policy.megatron_cfg.{key}=1" in err.fix
    assert not plan.ok


def test_each_missing_indexed_key_is_its_own_finding_and_null_is_not_missing():
    keys = [key for key, _ in MEGATRON_INDEXED_KEYS]
    bare = policy(**{f"megatron_cfg__{key}": DELETE for key in keys})
    missing = [f.key for f in build_plan_for_policy(bare, {}).findings if f.code == "MEGATRON_KEY_MISSING"]
    assert missing == [f"policy.megatron_cfg.{key}" for key in keys]
    # present (even null, which NeMo-RL reads without a KeyError) is not missing; a null CP is CONFIG_VALUE_INVALID
    assert "MEGATRON_KEY_MISSING" not in codes(policy(megatron_cfg__context_parallel_size=None))
    assert "CONFIG_VALUE_INVALID" in codes(policy(megatron_cfg__context_parallel_size=None))
    # without Megatron, or with no megatron_cfg mapping, NeMo-RL never reads them
    assert "MEGATRON_KEY_MISSING" not in codes(policy(megatron_cfg=DELETE, dtensor_cfg={"enabled": True}))
    assert "MEGATRON_KEY_MISSING" not in codes({**BASE, "megatron_cfg": "flash"})


@pytest.mark.skipif(
    not os.environ.get("ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS"),
    reason="ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS is not set (.ci/run sets it)",
)
@pytest.mark.parametrize("ref", ["7ea279a", "v0.7.0", "v0.6.0", "v0.5.0"])
def test_the_indexed_keys_are_exactly_those_lm_policy_indexes(ref):
    source = Path(os.environ["ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS"], ref, "nemo_rl/models/policy/lm_policy.py")
    indexed = re.findall(r'config\["megatron_cfg"\]\["(\w+)"\]', source.read_text())
    assert indexed == [key for key, _ in MEGATRON_INDEXED_KEYS]
