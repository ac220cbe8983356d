"""A probe result in words: the verdict sentence and the per-layer table."""

from __future__ import annotations

from nemo_rl_attn_align.probe.divergence import STAGES, ProbeResult


def verdict(result: ProbeResult) -> str:
    """One sentence: where the sides first differ and what attention adds by itself."""
    if result.first is None:
        where = f"the two sides agree at every probed layer (|diff| <= {result.atol:g})"
    else:
        first = result.first
        size = f"max |diff| {first.difference.max_abs:.3g}"
        where = f"the first difference is {first.operator} at layer {first.layer} ({size})"
    return f"{_attention_words(result)}; {where}{_rope_words(result)}{_replay_words(result)}"


def _rope_words(result: ProbeResult) -> str:
    shares = [(row.layer, row.rope_share.max_abs) for row in result.layers if row.rope_share is not None]
    if not shares:
        return ""
    adding = [(layer, most) for layer, most in shares if most > result.atol]
    if not adding:
        return "; RoPE on the same inputs adds 0 at every layer"
    layer, most = max(adding, key=lambda item: item[1])
    return f"; RoPE on the same inputs adds up to {most:.3g} (layer {layer})"


def _replay_words(result: ProbeResult) -> str:
    estimates = [row.replay_estimate.max_abs for row in result.layers if row.replay_estimate is not None]
    if result.replays is None or not estimates:
        return ""
    return (
        f"; the replays ({result.replays[1]} vs {result.replays[0]}) estimate attention adds up to {max(estimates):.3g}"
    )


def _attention_words(result: ProbeResult) -> str:
    shares = [(row.layer, row.attention_share) for row in result.layers if row.attention_share is not None]
    if not shares:
        return f"attention's share was not measured ({result.other} did not replay {result.reference}'s inputs)"
    adding = [(layer, share.max_abs) for layer, share in shares if share.max_abs > result.atol]
    if not adding:
        return "attention adds 0 at every layer"
    layer, most = max(adding, key=lambda item: item[1])
    others = "" if len(adding) == 1 else f" ({len(adding)} of {len(shares)} layers add more than {result.atol:g})"
    return f"attention at layer {layer} adds {most:.3g}{others}"


def table(result: ProbeResult) -> str:
    """The per-layer max |diff| of every stage, RoPE's and attention's shares, the logprob metrics,
    then what each side replaced to run on this machine (the CPU stand-in for Transformer Engine, ...)."""
    head = ["layer", *STAGES, "rope adds", "attention adds", "replay estimate"]
    lines = ["  ".join(f"{h:>15}" for h in head)]
    for row in result.layers:
        shares = (row.rope_share, row.attention_share, row.replay_estimate)
        cells = [str(row.layer), *(f"{row.stages[s].max_abs:.3g}" for s in STAGES)]
        cells += [f"{d.max_abs:.3g}" if d else "-" for d in shares]
        lines.append("  ".join(f"{c:>15}" for c in cells))
    lines.append(
        f"logprobs max |diff| {result.logprobs.max_abs:.3g}, mean {result.logprobs.mean_abs:.3g}; "
        f"token_mult_prob_error {result.token_mult_prob_error:.6g}; gen_kl_error {result.gen_kl_error:.3g}"
    )
    lines += [f"{side} ran with: {'; '.join(named)}" for side, named in result.substitutions.items() if named]
    return "\n".join(lines)
