"""Every ``attention_backend`` on one GPU through the plugin's own hooked path (tiny GPT, BF16, forward + backward).

Each case is a fresh process (``model_runner``): the NeMo-RL worker path (the real NeMo-RL's where it
is installed, else the stand-in >= 0.6 layout; the summary says which) with the plugin's hooks on its
seams builds a real megatron-core GPTModel on CUDA with the real Transformer Engine layer spec
(``local``: Megatron's local spec), Megatron sets the NVTE variables, and after
the first forward the plugin reads back what TE really selected. Strict mode is on, so a read-back
that differs from the request, or any failure of the plugin's own recording, fails the case.
"""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.contract.contract_preview import predict_training
from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND, NVTE_VARIABLES, TE_CLASS_BY_BACKEND
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.report.store import read_worker_files
from nemo_rl_attn_align.vocab.schema import Tier, fields_of
from tests.gpu.cases import BACKEND_CASES, TINY_GPT, policy_config, run_case

pytestmark = pytest.mark.mcore

SEQ, BATCH = 128, 2
TE_BACKENDS = ("FlashAttention", "FusedAttention", "UnfusedDotProductAttention")
BACKEND_BY_CLASS = {cls: name for name, cls in TE_CLASS_BY_BACKEND.items()}


def training_record(report_dir):
    """The one training worker's contract, determinism probe and host detail, as the driver reads them."""
    files = read_worker_files(report_dir)
    assert files.unreadable == () and files.incomplete_writes == ()
    [record] = files.records
    return record.contract, record.probe, files.details[record.key].to_dict()


@pytest.mark.parametrize("backend, impl", BACKEND_CASES)
def test_backend_runs_and_te_selected_what_was_asked(backend, impl, tmp_path, record_property):
    report = tmp_path / "report"
    policy = policy_config(backend, impl=impl)
    result = run_case(
        "model_runner",
        {"policy": policy, "seed": 1234, "batch": BATCH, "seq": SEQ},
        tmp_path,
        env={"NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report), "NEMO_RL_ATTN_ALIGN_STRICT": "1"},
        name=backend,
    )
    assert result.get("error") is None, result["error"]
    assert result["plugin_active"] and len(result["seams_wrapped"]) == 3, result["seams_wrapped"]
    assert result["model_config"]["attention_backend"] == backend
    assert result["nvte_after_build"] == NVTE_BY_BACKEND[backend]  # Megatron set what the plan said
    assert result["logits"] == {
        "shape": [BATCH, SEQ, TINY_GPT["vocab_size"]],
        "dtype": "torch.bfloat16",
        "finite": True,
    }
    grads = result["grads"]
    assert grads["finite"] and grads["count"] == grads["params"] == grads["nonzero"] > 0, grads

    observed = result["observed"]
    record_property("te_selected", observed.get("backend"))
    record_property("flash_attention_version", observed.get("flash_attention_version"))
    assert observed["status"] == "observed", observed
    if backend == "auto":
        assert observed["backend"] in TE_BACKENDS  # recorded, whichever TE preferred on this GPU
    else:
        assert observed["backend"] == TE_CLASS_BY_BACKEND[backend]
    if impl == "local":
        assert observed["engine"] == "megatron-local" and result["te"]["attention_params_set"] is False
    else:
        assert observed["engine"] == "megatron-te" and observed["source"].endswith("._attention_backends")

    contract, probe, detail = training_record(report)
    assert detail["stage"] == "first_forward" and detail["findings"] == [] and result["findings"] == []
    assert detail["nvte_after_build"] == NVTE_BY_BACKEND[backend] and detail["plan"]["effective"] == backend
    assert contract["backend"].provenance.value == "observed" and contract.value("backend") == observed["backend"]
    assert (
        contract.value("dtype") == "bf16"
        and contract.value("head_dim") == TINY_GPT["hidden_size"] // TINY_GPT["num_attention_heads"]
    )
    assert probe is not None and probe.torch_status == "probed"
    # The semantic tier recorded for what TE ran is what `check` previews for that backend.
    predicted = predict_training(
        read_recipe_facts({"policy": policy_config(BACKEND_BY_CLASS[observed["backend"]], impl=impl)})
    )
    semantic = fields_of(Tier.SEMANTIC)
    assert {n: contract.value(n) for n in semantic} == {n: predicted.value(n) for n in semantic}


def test_flash_with_fp32_is_stopped_by_the_plugin_before_te(tmp_path):
    """With the plugin: its own error, in the worker's config step, before any model or TE attention.
    Without it (control, same config): TE's error at the first forward, after the whole setup."""
    policy = policy_config("flash", precision="float32")
    report = tmp_path / "report"
    stopped = run_case(
        "model_runner", {"policy": policy}, tmp_path, env={"NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report)}, name="plugin"
    )
    error = stopped["error"]
    assert (error["type"], error["codes"], error["stage"]) == (
        "RuleViolation",
        ["FLASH_REQUIRES_HALF_PRECISION"],
        "setup",
    ), error
    assert "nemo_rl_attn_align.hosts.megatron_worker" in error["modules"]
    assert not any(m.startswith(("transformer_engine", "megatron.core.models")) for m in error["modules"]), error[
        "modules"
    ]
    assert stopped["te"]["attention_params_set"] is False and stopped["te"]["selections"] == []
    assert stopped["nvte_at_end"] == {name: None for name in NVTE_VARIABLES}  # no model: Megatron never set them
    assert not (report / "workers").exists()

    control = run_case("model_runner", {"policy": policy}, tmp_path, env={"NEMO_RL_ATTN_ALIGN": "0"}, name="control")
    assert control["plugin_active"] is False and control["seams_wrapped"] == []
    error = control["error"]
    assert (error["type"], error["stage"]) == ("ValueError", "forward"), error
    assert "No dot product attention backend is available" in error["message"]
    assert error["raised_in"].startswith("transformer_engine."), error["raised_in"]
