"""Rules for batch-invariant training and generation: what the hosts require, in their own words.

megatron-core 0.19.2 (``TransformerConfig.__post_init__``, the megatron-core NeMo-RL main runs)
asserts, with ``batch_invariant_mode``, a flash backend, a pinned ``flash_attention_version`` of 3
or 4 (so the training and inference attention paths run the same FlashAttention kernel), context
parallelism 1 and no attention dropout; the first and the third are ``combinations._batch_invariant``.
With Megatron generation (``policy.generation.backend: megatron``) the generation model runs the
settings of ``mcore_generation_config`` merged over ``megatron_cfg`` whenever it is a model of its
own: an attention setting that differs there is a warning (the run works; training and generation
then do not run the same attention). ``attention_backend`` and ``transformer_impl`` are not among
them: the dynamic inference engine calls flash-attn itself whatever they say.
"""

from __future__ import annotations

from typing import Any

from nemo_rl_attn_align.preflight.facts import UNSET, PolicyFacts
from nemo_rl_attn_align.preflight.rules.registry import MEGATRON_KEY, rule, truthy
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding
from nemo_rl_attn_align.vocab.limits import shown

_OVERRIDES = f"{MEGATRON_KEY}.model_overrides"
#: model_overrides that decide what the generation model's attention runs.
GENERATION_OVERRIDE_KEYS = ("batch_invariant_mode", "flash_attention_version", "deterministic_mode", "softmax_type")


@rule(Code.BATCH_INVARIANT_REQUIRES_FLASH_VERSION, Code.BATCH_INVARIANT_NO_ATTENTION_DROPOUT)
def _batch_invariant_kernels(facts: PolicyFacts) -> list[Finding]:
    overrides = facts.model_overrides
    if not facts.megatron_enabled or not truthy(overrides.get("batch_invariant_mode")):
        return []
    out = []
    version = overrides.get("flash_attention_version")
    if version not in (3, 4) or isinstance(version, bool):
        out.append(
            finding(
                Code.BATCH_INVARIANT_REQUIRES_FLASH_VERSION,
                f"{_OVERRIDES}.flash_attention_version",
                version,
                "Batch invariant mode requires --flash-attention-version 3 or 4 so the training and inference "
                f"attention paths run the same batch-invariant FlashAttention kernel (got {shown(version)}).",
                f"set {_OVERRIDES}.flash_attention_version=3 (Hopper, FlashAttention-3) or 4 (Blackwell).",
            )
        )
    dropout = overrides.get("attention_dropout", 0.0)
    if not isinstance(dropout, bool) and isinstance(dropout, (int, float)) and dropout != 0:
        out.append(
            finding(
                Code.BATCH_INVARIANT_NO_ATTENTION_DROPOUT,
                f"{_OVERRIDES}.attention_dropout",
                dropout,
                "Batch invariant mode does not support attention dropout.",
                f"set {_OVERRIDES}.attention_dropout=0.0 or turn batch_invariant_mode off.",
            )
        )
    return out


def _differences(trained: Any, generated: Any) -> list[tuple[str, Any, Any]]:
    """(key, training value, generation value) for each attention setting that differs, from the two
    ``model_overrides`` as written."""
    t_over, g_over = (None if trained is UNSET else trained) or {}, generated or {}
    if not isinstance(t_over, dict) or not isinstance(g_over, dict):
        return []
    pairs = [(f"model_overrides.{k}", t_over.get(k), g_over.get(k)) for k in GENERATION_OVERRIDE_KEYS]
    return [(key, t, g) for key, t, g in pairs if t != g]


@rule(Code.GENERATION_ATTENTION_DIFFERS)
def _generation_attention(facts: PolicyFacts) -> list[Finding]:
    found = facts.generation_model
    if not facts.megatron_enabled or found is None or not found[1] or not facts.has_megatron_cfg:
        return []
    return [
        finding(
            Code.GENERATION_ATTENTION_DIFFERS,
            f"policy.generation.mcore_generation_config.{key}",
            generated,
            f"Megatron generation's model runs {key}={shown(generated)} ({found[2]}) while training runs "
            f"{shown(trained)}: the two sides do not run the same attention.",
            f"set the same value in {MEGATRON_KEY}.{key} and policy.generation.mcore_generation_config.{key}, "
            "or leave it out of mcore_generation_config.",
        )
        for key, trained, generated in _differences(facts.model_overrides_raw, found[0].get("model_overrides"))
    ]
