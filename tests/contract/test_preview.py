"""``check``'s preview: both contracts predicted from real YAML files, and their binding."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.binding.binding import Status, Verdict
from nemo_rl_attn_align.binding.determinism import DetStatus
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.contract.contract_preview import absent_sides, predict_rollout, predict_training
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.report.report_render import render_preview
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.schema import FIELD_NAMES, Provenance, Tier, fields_of
from tests.conftest import EXAMPLES, preview_of

GRPO = EXAMPLES / "grpo_math_1B_megatron_flash.yaml"
VLLM_ENV = "++policy.generation.vllm_cfg.env_vars"
MEGATRON_ENV = "++policy.megatron_cfg.env_vars"
OVERRIDES = "++policy.megatron_cfg.model_overrides"


def _preview(*overrides, environ=None, path=GRPO):
    cfg = load_config(path, list(overrides))
    return preview_of(cfg, environ)


def _errors(binding):
    return {(f.key, f.code) for f in binding.findings() if f.severity.value == "error"}


def test_stock_example_fails_on_the_rollout_reduction_order_and_says_why():
    preview = _preview()
    binding = preview.binding
    assert binding.verdict is Verdict.FAIL
    assert _errors(binding) == {("contract.semantic.reduction_order", Code.ATTN_SEMANTIC_MANDATE.value)}
    result = binding.result("reduction_order")
    assert (result.training.value, result.rollout.value, result.demand) == ("kv_index", "split_kv", "kv_index")
    assert "rollout 'split_kv'" in result.message and "split-KV" in result.rollout.source
    (finding,) = [f for f in binding.findings() if f.code == Code.ATTN_SEMANTIC_MANDATE.value]
    assert "VLLM_BATCH_INVARIANT=1" in finding.fix
    # the model's attention as each host reads its config.json (in the test's Hugging Face cache) agrees
    for name in ("architecture", "num_layers", "attention_layers", "head_dim", "softmax_type", "mla", "vocab_size"):
        assert binding.result(name).status is Status.MATCH, name
    for name in ("causal", "tokenizer", "batch_size", "merge_rule", "acc_dtype", "downcast", "dtype"):
        assert binding.result(name).status is Status.MATCH, name
    assert binding.result("batch_size").training.value == 32 * 16
    text = render_preview(preview)
    assert "reduction_order" in text and "MISMATCH" in text and "[pending]" in text
    json.dumps(preview.to_dict(), allow_nan=False)


def test_a_model_not_on_this_machine_leaves_its_identity_pending_and_says_how_to_fetch_it():
    preview = _preview("policy.model_name=acme/not-here")
    for name in ("architecture", "num_layers", "attention_layers", "head_dim", "softmax_type", "vocab_size"):
        assert preview.binding.result(name).code is Code.ATTN_PENDING, name
    assert any(note.endswith("hf download acme/not-here config.json") for note in preview.notes)


def test_predicted_contracts_are_whole_and_valid():
    cfg = load_config(GRPO)
    for contract in (predict_training(read_recipe_facts(cfg, {})), predict_rollout(read_recipe_facts(cfg, {}), {})):
        assert isinstance(contract, AttentionContract) and list(contract.fields) == list(FIELD_NAMES)
        assert {fv.provenance for _, fv in contract} <= {Provenance.CONFIGURED, Provenance.PENDING}
        assert AttentionContract.from_json(contract.to_json()) == contract
        assert all(fv.source for _, fv in contract), "every prediction says where it comes from"


def test_batch_invariant_rollout_meets_the_mandate_but_cublas_differs():
    preview = _preview(f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1")
    binding = preview.binding
    assert all(binding.result(n).status is Status.MATCH for n in fields_of(Tier.SEMANTIC))
    assert _errors(binding) == {("determinism.CUBLAS_WORKSPACE_CONFIG", Code.DET_BLOCKING_MISMATCH.value)}
    assert binding.determinism.collective is None  # TP=1 on both sides: the NCCL variables are only recorded
    assert binding.determinism.entry("NCCL_ALGO").status is DetStatus.DIFFERENT
    assert any("vLLM 0.33" in note for note in preview.notes)
    # a deterministic cuBLAS workspace on the training side too: nothing disagrees any more
    aligned = _preview(f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1", f"{MEGATRON_ENV}.CUBLAS_WORKSPACE_CONFIG=:4096:8")
    assert aligned.binding.verdict is Verdict.PASS and aligned.binding.passed
    assert aligned.binding.determinism.entry("CUBLAS_WORKSPACE_CONFIG").status is DetStatus.EQUIVALENT


def test_the_driver_environment_reaches_both_sides():
    preview = _preview(f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1", environ={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert preview.binding.passed
    assert _preview(environ={"VLLM_BATCH_INVARIANT": "1"}).binding.result("reduction_order").status is Status.MATCH


def test_tensor_parallel_makes_the_allreduce_algorithm_blocking():
    preview = _preview(
        f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1",
        "policy.generation.vllm_cfg.tensor_parallel_size=2",
        f"{MEGATRON_ENV}.CUBLAS_WORKSPACE_CONFIG=:16:8",
    )
    det = preview.binding.determinism
    assert det.collective == "allreduce"
    assert {e.name for e in det.entries if e.blocking} == {"NCCL_ALGO", "NCCL_PROTO"}


def test_context_parallel_p2p_fails_order_and_downcast_all_gather_does_not():
    ring = _preview("policy.megatron_cfg.context_parallel_size=2", f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1").binding
    assert {key for key, _ in _errors(ring)} >= {"contract.semantic.reduction_order", "contract.semantic.downcast"}
    assert ring.result("reduction_order").training.value == "ring_step"
    assert ring.result("downcast").training.value == "per_partial"
    assert ring.result("cp_comm_type").training.value == "p2p"
    gathered = _preview(
        "policy.megatron_cfg.context_parallel_size=2",
        f"{OVERRIDES}.cp_comm_type=all_gather",
        f"{VLLM_ENV}.VLLM_BATCH_INVARIANT=1",
    ).binding
    assert gathered.result("reduction_order").status is Status.MATCH
    assert gathered.result("reduction_engine").training.value == "te_cp_all_gather"


def test_fp32_reference_against_bf16_rollout_needs_allow_dtype_difference():
    args = (
        "policy.precision=float32",
        "policy.megatron_cfg.attention_backend=auto",
        "policy.generation.vllm_cfg.precision=bfloat16",
    )
    plain = _preview(*args).binding
    assert plain.result("merge_rule").training.value == "full_softmax"  # TE runs fp32 only unfused
    assert ("contract.semantic.dtype", Code.ATTN_SEMANTIC_MANDATE.value) in _errors(plain)
    swept = _preview(
        *args,
        "++attention_align.allow_dtype_difference=true",
        "++attention_align.mandate.merge_rule=null",
        "++attention_align.mandate.reduction_order=null",
    ).binding
    assert swept.result("dtype").status is Status.ALLOWED
    # the dtype is allowed; what stays is that unfused fp32 and vLLM's kernels fold differently
    assert _errors(swept) == {
        ("contract.semantic.merge_rule", Code.ATTN_SEMANTIC_SIDES_DIFFER.value),
        ("contract.semantic.reduction_order", Code.ATTN_SEMANTIC_SIDES_DIFFER.value),
    }


def test_model_overrides_on_the_training_side_only_break_the_identity():
    binding = _preview(f"{OVERRIDES}.num_layers=20").binding
    result = binding.result("num_layers")
    assert (result.training.value, result.rollout.value, result.status) == (20, 28, Status.MISMATCH)


def test_megatron_deterministic_mode_predicts_its_environment_and_problems():
    preview = _preview(f"{OVERRIDES}.deterministic_mode=true", f"{MEGATRON_ENV}.NCCL_ALGO=Tree")
    assert any("rejects NCCL_ALGO='Tree'" in note for note in preview.notes)
    clean = _preview(f"{OVERRIDES}.deterministic_mode=true")
    entry = clean.binding.determinism.entry("CUBLAS_WORKSPACE_CONFIG")
    assert entry.training == ":4096:8" and clean.binding.result("deterministic").training.value is True


def test_a_config_without_vllm_or_megatron_has_nothing_to_bind():
    sft = _preview(path=EXAMPLES / "sft_megatron_flash.yaml")
    assert sft.training is not None and sft.rollout is None and sft.binding is None
    assert any("policy.generation.backend is not set" in n for n in sft.notes)
    assert sft.to_dict()["verdict"] is None and "note:" in render_preview(sft)
    no_megatron = _preview("policy.megatron_cfg.enabled=false")
    assert no_megatron.training is None and no_megatron.binding is None


def test_absent_sides_name_the_key_that_decides():
    assert absent_sides(read_recipe_facts(load_config(EXAMPLES / "sft_megatron_flash.yaml"))) == {
        "rollout": "policy.generation.backend is not set (no generation workers to bind)"
    }
    assert absent_sides(read_recipe_facts(load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml"))) == {}
    assert set(absent_sides(read_recipe_facts({"policy": {"megatron_cfg": None, "generation": None}}))) == {
        "training",
        "rollout",
    }


def test_an_invalid_backend_leaves_the_semantic_tier_pending():
    binding = _preview("policy.megatron_cfg.attention_backend=flashh").binding
    assert all(binding.result(n).training.provenance is Provenance.PENDING for n in fields_of(Tier.SEMANTIC))
    assert binding.result("merge_rule").code is Code.ATTN_PENDING  # the rollout side meets the mandate: not comparable
    assert binding.result("reduction_order").code is Code.ATTN_SEMANTIC_MANDATE  # the rollout side breaks it anyway
    assert binding.result("backend").training.provenance is Provenance.PENDING


def test_settings_default_to_the_config_own_block():
    cfg = load_config(GRPO, ["++attention_align.mandate.reduction_order=split_kv"])
    result = preview_of(cfg).binding.result("reduction_order")
    assert result.demand == "split_kv" and result.code is Code.ATTN_SEMANTIC_MANDATE
    assert "training 'kv_index'" in result.message and "rollout" not in result.message.split(",")[0]


_BASE = load_config(GRPO)
_KEYS = [
    ("policy", "megatron_cfg", "context_parallel_size"),
    ("policy", "megatron_cfg", "tensor_model_parallel_size"),
    ("policy", "megatron_cfg", "model_overrides"),
    ("policy", "megatron_cfg", "env_vars"),
    ("policy", "megatron_cfg", "apply_rope_fusion"),
    ("policy", "logprob_batch_size"),
    ("policy", "precision"),
    ("policy", "generation", "vllm_cfg", "precision"),
    ("policy", "generation", "vllm_cfg", "tensor_parallel_size"),
    ("policy", "generation", "vllm_cfg", "kv_cache_dtype"),
    ("policy", "generation", "vllm_cfg", "enable_prefix_caching"),
    ("policy", "generation", "vllm_kwargs"),
    ("policy", "tokenizer", "name"),
    ("grpo", "num_prompts_per_step"),
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.sampled_from(["bfloat16", "fp8", "p2p", "all_gather", "FLASH_ATTN", "1"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(
            st.sampled_from(
                [
                    "num_layers",
                    "cp_comm_type",
                    "block_size",
                    "max_num_seqs",
                    "attention_backend",
                    "enable_chunked_prefill",
                    "max_num_batched_tokens",
                    "deterministic_mode",
                    "VLLM_BATCH_INVARIANT",
                    "CUBLAS_WORKSPACE_CONFIG",
                    "kv_channels",
                ]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=5,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_KEYS), _values), min_size=1, max_size=4))
def test_arbitrary_values_never_crash_the_preview(edits):
    cfg = copy.deepcopy(_BASE)
    for path, value in edits:
        node = cfg
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    try:
        preview = preview_of(cfg)
    except UsageError as err:
        assert "\n" not in str(err)
        return
    json.dumps(preview.to_dict(), allow_nan=False)
    render_preview(preview)


@pytest.mark.parametrize("prompts", [-16, 0, True, "32"])
def test_unusable_batch_counts_leave_batch_size_pending(prompts):
    cfg = copy.deepcopy(_BASE)
    cfg["grpo"]["num_prompts_per_step"] = prompts
    training = preview_of(cfg).training
    assert training["batch_size"].provenance is Provenance.PENDING


def test_a_source_names_the_key_its_value_came_from():
    """``physical_batch`` falls back to train_micro_batch_size, the rollout dtype to policy.precision:
    the source says which key was read."""
    cfg = load_config(GRPO)
    del cfg["policy"]["logprob_batch_size"], cfg["policy"]["generation"]["vllm_cfg"]["precision"]
    training, rollout = predict_training(read_recipe_facts(cfg, {})), predict_rollout(read_recipe_facts(cfg, {}), {})
    assert training["physical_batch"].source == "policy.train_micro_batch_size"
    assert training["physical_batch"].value == cfg["policy"]["train_micro_batch_size"]
    assert rollout["dtype"].source == "policy.precision"
    cfg = load_config(GRPO)
    assert predict_training(read_recipe_facts(cfg, {}))["physical_batch"].source == "policy.logprob_batch_size"
    assert predict_rollout(read_recipe_facts(cfg, {}), {})["dtype"].source == "policy.generation.vllm_cfg.precision"
