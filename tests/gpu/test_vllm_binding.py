"""A real vLLM engine records the rollout contract; bound to the training contract of the same model,
it gives the tiers the plugin promises.

The rollout side: ``vllm_runner`` writes a tiny random Llama and starts ``vllm.LLM`` on it with the
plugin installed (no manual registration). The training side: ``model_runner`` builds a Megatron
GPTModel from that checkpoint's ``config.json`` (as Megatron-Bridge would) with TE FlashAttention,
through the plugin's hooked worker path. Both write into one report dir and the driver's own
``report.document.collect`` binds them. Expected:

* identity: every field equal, except what one side cannot observe: ``architecture`` (a
  TransformerConfig has none) and ``batch_size`` (known only per compared step);
* semantic: the statuses ``check`` predicts for the same config (``preview_binding``): the decode
  split-KV order fails the ``kv_index`` mandate by default, ``VLLM_BATCH_INVARIANT=1`` fixes it;
* recorded: the engine and backend differences (``megatron-te``/``FlashAttention`` against
  ``vllm``/``FLASH_ATTN``...) are listed, never rejected.

The older engine-only test ``tests/hosts/test_vllm_worker.py::test_real_vllm_engine_is_recorded``
(marked ``vllm_gpu``) covers the record alone.
"""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.config.settings import load_settings
from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide
from nemo_rl_attn_align.report.document import RunDescription, collect
from nemo_rl_attn_align.vocab.schema import Tier
from tests.conftest import preview_of
from tests.gpu.cases import CUBLAS, TINY_LLAMA, master_config, megatron_model_from_hf, policy_config, run_case

#: Identity fields one side legitimately cannot observe (the binding then says not comparable).
UNOBSERVABLE_IDENTITY = {"architecture", "batch_size"}


@pytest.mark.mcore
@pytest.mark.vllm_gpu
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch_invariant"])
def test_vllm_rollout_binds_to_the_training_contract(batch_invariant, tmp_path, record_property):
    report, model_dir = tmp_path / "report", tmp_path / "tiny-llama"
    rollout_env = {
        "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report),
        **({"VLLM_BATCH_INVARIANT": "1"} if batch_invariant else {}),
    }
    rollout = run_case(
        "vllm_runner",
        {"model_dir": str(model_dir), "hf_config": TINY_LLAMA, "seed": 0},
        tmp_path,
        env=rollout_env,
        timeout=420,
        name="vllm",
    )
    assert rollout["seam_wrapped"] and rollout["stage"] == "engine_ready" and rollout["findings"] == [], rollout
    assert rollout["entry_point_listed"] or rollout["bootstrap_origin"], (
        "the plugin is not installed in this environment"
    )
    assert len(rollout["generated"]) == 4  # the engine still generates after our hook
    record_property("vllm_layer_backends", sorted(set(rollout["layer_backends"].values())))

    policy = policy_config("flash", model=megatron_model_from_hf(rollout["config_json"]), tokenizer=str(model_dir))
    training_env = {
        "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report),
        "NEMO_RL_ATTN_ALIGN_STRICT": "1",
        **(CUBLAS if batch_invariant else {}),
    }
    training = run_case("model_runner", {"policy": policy}, tmp_path, env=training_env, name="training")
    assert training.get("error") is None, training["error"]
    assert training["observed"]["backend"] == "FlashAttention"

    cfg = master_config(policy, batch_invariant)
    settings = load_settings(cfg)
    preview = preview_of(cfg, settings=settings)
    doc = collect(
        report,
        settings,
        RunDescription(
            expected={
                "training": ExpectedSide(None, ("policy-rank0",), "test"),
                "rollout": ExpectedSide(None, (rollout["worker_id"],), "test"),
            }
        ),
    )
    assert doc["workers"]["missing"] == [] and doc["binding"] is not None, doc["workers"]
    fields = {f["field"]: f for f in doc["binding"]["fields"]}
    record_property("binding_summary", doc["binding"]["summary"])

    identity = {n: f for n, f in fields.items() if f["tier"] == Tier.IDENTITY.value and f["status"] != "match"}
    assert set(identity) == UNOBSERVABLE_IDENTITY, {n: (f["training"], f["rollout"]) for n, f in identity.items()}
    for name, result in identity.items():
        assert result["status"] == "not_comparable", name
        assert "unobservable" in (result["training"]["provenance"], result["rollout"]["provenance"]), result

    predicted = {r.name: r.status.value for r in preview.binding.results if r.tier is Tier.SEMANTIC}
    assert {n: fields[n]["status"] for n in predicted} == predicted, {n: fields[n] for n in predicted}
    assert (fields["reduction_order"]["status"] == "match") is batch_invariant

    recorded = {n: f for n, f in fields.items() if f["tier"] == Tier.RECORDED.value}
    different = {n for n, f in recorded.items() if f["status"] == "different"}
    assert {"engine", "backend"} <= different, different
    assert all(f["status"] in ("match", "different", "not_comparable") for f in recorded.values())
    assert all(fields[n]["code"] == "ATTN_RECORDED_DIFFERENCE" for n in different)

    expected = "fail" if "mismatch" in predicted.values() else "incomparable"
    assert doc["verdict"] == expected, doc["binding"]["summary"]
