"""TE's DotProductAttention against the reference attention on the same BF16 inputs:
``python -m tests.gpu.attention_runner SPEC RESULT`` (the parent sets NVTE_* to force one backend).

Spec: ``{"seed": int, "heads": Hq, "kv_heads": Hkv, "head_dim": D, "cases": [{"format": "bshd" |
"sbhd" | "thd", "seqlens": [...], "q_scale": s}]}`` (``q_scale`` sharpens the softmax: logits of std
s); bshd/sbhd need equal sequence lengths (causal mask), thd takes any (``padding_causal`` with
``cu_seqlens``, NeMo-RL's packed sequences). Every case is
compared in the reference's packed ``[T, H, D]`` layout with the same ``cu_seqlens``.

The bound (``bf16_bound``), per output element, with ``A = P·|V|`` (the exact softmax weights
applied to ``|V|``) and ``O`` the exact FP64 output on the same rounded inputs:

* FlashAttention (FA2/FA3) computes ``S = QKᵀ`` and the online softmax in FP32, but rounds the
  probabilities ``P ≤ 1`` to BF16 for the ``P·V`` product (relative error ``≤ 2⁻⁸`` each, BF16
  has an 8-bit significand) while the row sum uses the FP32 values; the output error from that is
  ``|Σ_j p_j δ_j v_j| ≤ 2⁻⁸ Σ_j p_j |v_j| = 2⁻⁸·A``. Its one rounding of the FP32 result to BF16
  adds ``≤ 2⁻⁸·|O|``. FP32 score and accumulation error, ``exp2`` approximation: ``≤ 2⁻¹¹·A`` (generous).
* The reference is within one BF16 ulp of ``O`` (``≤ 2⁻⁷·|O|``) plus ``2⁻²⁰·max|v|`` (its docstring,
  checked against FP64 by tests/reference).

So ``|TE − exact| ≤ 2⁻⁸·A + 2⁻⁸·|O| + 2⁻¹¹·A`` and ``|TE − reference| ≤ that + 2⁻⁷·|O| + 2⁻²⁰·max|v|``.
Both orders accumulate in FP32 and round once, but FlashAttention's tile order and its BF16 ``P``
differ from the reference's fixed block order, so bitwise equality is not expected; the result
reports the largest ratio of error to bound (must be ``≤ 1``).
"""

from __future__ import annotations

import sys
from typing import Any

from tests.gpu.runner_io import main


def bf16_bound(a, out_exact, max_v: float, with_reference: bool):
    """The per-element bound above: ``a`` = ``P·|V|`` and ``out_exact`` = ``O``, both FP64."""
    bound = 2.0**-8 * a + 2.0**-8 * out_exact.abs() + 2.0**-11 * a
    if with_reference:
        bound = bound + 2.0**-7 * out_exact.abs() + 2.0**-20 * max_v
    return bound


def _layouts(fmt: str, seqlens: list[int]):
    """(to TE layout, from TE output back to packed [T, H, D]) for one format."""
    batch, seq = len(seqlens), seqlens[0]
    if fmt != "thd" and len(set(seqlens)) != 1:
        raise ValueError(f"{fmt} needs equal sequence lengths, got {seqlens}")
    if fmt == "bshd":
        return (
            lambda x: x.reshape(batch, seq, *x.shape[1:]).contiguous(),
            lambda o, h, d: o.reshape(batch * seq, h, d),
        )
    if fmt == "sbhd":
        return (
            lambda x: x.reshape(batch, seq, *x.shape[1:]).transpose(0, 1).contiguous(),
            lambda o, h, d: o.reshape(seq, batch, h, d).transpose(0, 1).reshape(batch * seq, h, d),
        )
    if fmt == "thd":
        return (lambda x: x.contiguous(), lambda o, h, d: o.reshape(-1, h, d))
    raise ValueError(f"format {fmt!r} is not one of bshd, sbhd, thd")


def compare(case: dict[str, Any], heads: int, kv_heads: int, head_dim: int, seed: int) -> dict[str, Any]:
    import torch
    import transformer_engine.pytorch as te

    from nemo_rl_attn_align.hosts import te_readback
    from nemo_rl_attn_align.reference.attention import exact_attention, reference_attention
    from nemo_rl_attn_align.reference.causal import Causal

    fmt, seqlens = case["format"], case["seqlens"]
    total = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(total, h, head_dim, device="cuda", generator=gen) for h in (heads, kv_heads, kv_heads))
    q, k, v = (case.get("q_scale", 1.0) * q).bfloat16(), k.bfloat16(), v.bfloat16()
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    to_te, from_te = _layouts(fmt, seqlens)
    mask = "padding_causal" if fmt == "thd" else "causal"
    dpa = te.DotProductAttention(heads, head_dim, num_gqa_groups=kv_heads, qkv_format=fmt, attn_mask_type=mask)
    kwargs = (
        {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": max(seqlens), "max_seqlen_kv": max(seqlens)}
        if fmt == "thd"
        else {}
    )
    with torch.no_grad():
        out_te = from_te(dpa(to_te(q), to_te(k), to_te(v), **kwargs), heads, head_dim).double()
    observed = te_readback.observe([dpa])
    packed = Causal(cu_seqlens_q=cu, cu_seqlens_k=cu)
    out_ref, _ = reference_attention(q, k, v, packed)
    out_exact, _ = exact_attention(q, k, v, packed)
    weights_abs_v, _ = exact_attention(q, k, v.abs(), packed)  # A = P·|V|
    max_v = float(v.abs().max())
    te_ref = (out_te - out_ref.double()).abs()
    te_exact = (out_te - out_exact).abs()
    return {
        **case,
        "backend": observed.get("backend"),
        "te_source": observed.get("source"),
        "flash_attention_version": observed.get("flash_attention_version"),
        "max_abs_v": max_v,
        "max_te_vs_reference": float(te_ref.max()),
        "mean_te_vs_reference": float(te_ref.mean()),
        "max_te_vs_exact": float(te_exact.max()),
        "max_reference_vs_exact": float((out_ref.double() - out_exact).abs().max()),
        "ratio_te_vs_reference": float((te_ref / bf16_bound(weights_abs_v, out_exact, max_v, True)).max()),
        "ratio_te_vs_exact": float((te_exact / bf16_bound(weights_abs_v, out_exact, max_v, False)).max()),
        "bitwise_equal_to_reference": bool(torch.equal(out_te.to(torch.bfloat16), out_ref)),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.cuda.set_device(0)
    cases = [
        compare(case, spec["heads"], spec["kv_heads"], spec["head_dim"], spec.get("seed", 0) + i)
        for i, case in enumerate(spec["cases"])
    ]
    return {"device": torch.cuda.get_device_name(), "cases": cases}


if __name__ == "__main__":
    sys.exit(main(run))
