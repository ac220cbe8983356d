"""Pre-flight rules on what would crash the host at start, after the cluster is up: a
``policy.generation.vllm_kwargs`` key NeMo-RL's vLLM worker passes to vLLM itself
(``preflight.vllm_worker_kwargs``: the keys of each NeMo-RL ref, read from its source).
"""

from __future__ import annotations

from nemo_rl_attn_align.preflight.facts import PolicyFacts
from nemo_rl_attn_align.preflight.rules.registry import rule
from nemo_rl_attn_align.preflight.vllm_worker_kwargs import reserved_keys
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding

VLLM_KWARGS_KEY = "policy.generation.vllm_kwargs"


@rule(Code.VLLM_KWARG_PASSED_TWICE)
def _vllm_kwargs_passed_twice(facts: PolicyFacts) -> list[Finding]:
    """``BaseVllmGenerationWorker._load_model`` builds ``dict(model=..., seed=..., ..., **vllm_kwargs)``:
    a key of both raises TypeError ("got multiple values for keyword argument") when the worker starts."""
    if not facts.vllm_kwargs:
        return []
    reserved = reserved_keys(facts.nemo_rl_version)
    findings = []
    for key, value in facts.vllm_kwargs.items():
        if key not in reserved.keys:
            continue
        source = reserved.keys[key]
        instead = f"NeMo-RL takes it from policy.generation.{source}" if source else "NeMo-RL sets it itself"
        findings.append(
            finding(
                Code.VLLM_KWARG_PASSED_TWICE,
                f"{VLLM_KWARGS_KEY}.{key}",
                value,
                f"the vLLM worker of {reserved.which} passes {key} to vLLM itself (dict({key}=..., **vllm_kwargs)), "
                "so it gets the key twice and raises TypeError when the worker starts, after the cluster is up.",
                f"remove {VLLM_KWARGS_KEY}.{key}; {instead}.",
            )
        )
    return findings
