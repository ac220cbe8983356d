"""What the GPU suite feeds its cases, checked where it can be: on CPU, on every machine (not ``mcore``).

The GPU tests cannot run here, so their inputs are checked instead: every case's policy config
gets the plan the test expects from the plugin's own rules, the stand-in model config accepts every
key a case sends, the HF-to-Megatron mapping reads both ``config.json`` styles, and the BF16 bound
of ``test_te_vs_reference`` holds for FlashAttention's arithmetic yet rejects plain BF16 attention.
"""

from __future__ import annotations

import math

import pytest

from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND
from nemo_rl_attn_align.preflight.plan import build_plan_for_policy
from tests.conftest import preview_of
from tests.gpu.cases import (
    BACKEND_CASES,
    TINY_LLAMA,
    master_config,
    megatron_model_from_hf,
    model_runner_policies,
    policy_config,
)

HF_V4 = {**TINY_LLAMA, "rope_theta": 10000.0, "architectures": ["LlamaForCausalLM"]}
HF_V5 = {**TINY_LLAMA, "head_dim": 64, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}


@pytest.mark.parametrize("backend, impl", BACKEND_CASES)
def test_each_backend_case_passes_the_preflight_with_the_planned_nvte(backend, impl):
    plan = build_plan_for_policy(policy_config(backend, impl=impl), environ={})
    assert plan.ok and plan.findings == [] and plan.effective == backend and plan.nvte == NVTE_BY_BACKEND[backend]


def test_the_fp32_case_is_one_the_plugin_stops():
    plan = build_plan_for_policy(policy_config("flash", precision="float32"), environ={})
    assert [f.code for f in plan.errors] == ["FLASH_REQUIRES_HALF_PRECISION"]


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_the_vllm_case_config_previews_the_semantic_verdict_the_test_expects(batch_invariant):

    cfg = master_config(
        policy_config("flash", model=megatron_model_from_hf(HF_V4), tokenizer="/models/tiny"), batch_invariant
    )
    preview = preview_of(cfg)
    mismatched = [r.name for r in preview.binding.results if r.status.value == "mismatch"]
    assert mismatched == ([] if batch_invariant else ["reduction_order"])


def test_megatron_fields_from_both_config_json_styles():
    assert megatron_model_from_hf(HF_V4) == {
        "num_layers": 2,
        "hidden_size": 256,
        "ffn_hidden_size": 1024,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 64,
        "vocab_size": 1024,
        "seq_length": 256,
        "rotary_base": 10000.0,
    }
    assert (
        megatron_model_from_hf(HF_V5)["rotary_base"] == 500000.0 and megatron_model_from_hf(HF_V5)["kv_channels"] == 64
    )


def test_the_stand_in_model_config_takes_every_key_a_case_sends():
    pytest.importorskip("megatron.core")
    from tests.fake_nemo_rl.cpu_megatron import TINY_MODEL, StandInGPTProvider

    for policy in model_runner_policies():
        cfg = StandInGPTProvider(**{**TINY_MODEL, **policy["standin_model"]}, use_cpu_initialization=True)
        assert all(getattr(cfg, key) == value for key, value in policy["standin_model"].items())
        assert cfg.kv_channels * cfg.num_attention_heads == cfg.hidden_size


def _attention(q, k, v, arithmetic: str):
    """Causal GQA attention of one sequence ([T, H, D], BF16 in and out) computed two ways:
    ``flash``: FP32 scores and softmax, P rounded to BF16 for P·V, FP32 row sum, one final rounding
    (what the bound assumes); ``bf16``: plain BF16 attention, scores rounded to BF16 before the softmax."""
    import torch

    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1).transpose(0, 1).float() for x in (k, v))
    qq = q.transpose(0, 1).float()
    scores = qq @ kk.transpose(1, 2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    if arithmetic == "bf16":
        scores = scores.bfloat16().float()
    p = (scores - scores.amax(-1, keepdim=True)).exp()
    out = (p.bfloat16().float() @ vv) / p.sum(-1, keepdim=True)
    return out.transpose(0, 1).bfloat16()


def test_the_bf16_bound_holds_for_flash_arithmetic_and_rejects_plain_bf16():
    torch = pytest.importorskip("torch")
    from nemo_rl_attn_align.reference.attention import exact_attention, reference_attention
    from tests.gpu.attention_runner import bf16_bound

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(300, h, 64, generator=gen) for h in (8, 2, 2))
    q, k, v = (3 * q).bfloat16(), k.bfloat16(), v.bfloat16()  # logits of std 3: a peaked softmax, as trained heads have
    exact, _ = exact_attention(q, k, v)
    a, _ = exact_attention(q, k, v.abs())
    reference, _ = reference_attention(q, k, v)
    max_v = float(v.abs().max())

    def ratio(out, against, with_reference):
        return float(((out.double() - against.double()).abs() / bf16_bound(a, exact, max_v, with_reference)).max())

    flash = _attention(q, k, v, "flash")
    assert ratio(flash, exact, False) <= 1 and ratio(flash, reference, True) <= 1  # measured 0.6-0.75 and ~0.5
    assert ratio(_attention(q, k, v, "bf16"), exact, False) > 2  # measured 5-6.5 over seeds 0-7
