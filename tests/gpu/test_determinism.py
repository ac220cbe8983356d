"""Deterministic mode on one GPU: two fresh processes, same seed, bitwise-equal logits and gradients.

The mode is what a NeMo-RL user sets: ``deterministic_mode: true`` on the TransformerConfig
(``megatron_cfg.model_overrides``; here the case's ``standin_model``: the stand-in's model config,
or the checkpoint's on the real worker path), ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``
(TE then asks flash-attn for its deterministic backward and keeps FusedAttention only where cuDNN's
is deterministic), ``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``.
Everything else (weights, tokens) comes from the seed. The runs go through the plugin's hooked
path, so the record must also say the mode was on.
"""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.preflight.backend import TE_CLASS_BY_BACKEND
from nemo_rl_attn_align.report.store import read_worker_files
from tests.gpu.cases import policy_config, run_case

pytestmark = pytest.mark.mcore

DETERMINISTIC_ENV = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NEMO_RL_ATTN_ALIGN_STRICT": "1",
}


@pytest.mark.parametrize("backend", ["flash", "fused"])
def test_deterministic_mode_is_bitwise_repeatable(backend, tmp_path):
    torch = pytest.importorskip("torch")
    policy = policy_config(backend, model={"deterministic_mode": True})
    saved = []
    for run in ("first", "second"):
        report = tmp_path / run / "report"
        spec = {"policy": policy, "seed": 77, "deterministic": True, "save_tensors": str(tmp_path / f"{run}.pt")}
        result = run_case(
            "model_runner",
            spec,
            tmp_path / run,
            env={**DETERMINISTIC_ENV, "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report)},
            name=run,
        )
        if backend == "fused" and result.get("error") and result["device"]["capability"][0] >= 10:
            pytest.skip(
                "TE disables FusedAttention for deterministic training on Blackwell "
                "(get_attention_backend, determinism filter)"
            )
        assert result.get("error") is None, result["error"]
        assert result["observed"]["backend"] == TE_CLASS_BY_BACKEND[backend]
        assert result["model_config"]["deterministic_mode"] is True
        [record] = read_worker_files(report).records
        contract, probe = record.contract, record.probe
        assert contract.value("deterministic") is True
        assert (
            probe.env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0" and probe.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        )
        assert probe.torch["deterministic_algorithms"] is True
        saved.append(torch.load(tmp_path / f"{run}.pt", weights_only=True))
    first, second = saved
    assert first["logits"].dtype == torch.bfloat16 and torch.equal(first["logits"], second["logits"])
    assert first["grads"].keys() == second["grads"].keys() and len(first["grads"]) > 0
    differing = sorted(n for n in first["grads"] if not torch.equal(first["grads"][n], second["grads"][n]))
    assert differing == [], f"gradients differ between the two runs: {differing}"
