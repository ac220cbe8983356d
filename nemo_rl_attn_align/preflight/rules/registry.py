"""The rule mechanism: ``@rule(Code.X, ...)`` registers a check, ``RULES`` lists them in order.

A rule reads ``PolicyFacts`` and returns ``Finding`` objects made with ``errors.finding`` (the
severity comes from ``codes.Code``). The keys rules report and two small helpers live here too, so
``values.py`` and ``combinations.py`` share them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_rl_attn_align.preflight.facts import PolicyFacts
from nemo_rl_attn_align.vocab.codes import Code, Kind
from nemo_rl_attn_align.vocab.errors import Finding

MEGATRON_KEY = "policy.megatron_cfg"
BACKEND_KEY = f"{MEGATRON_KEY}.attention_backend"

Rule = Callable[[PolicyFacts], list[Finding]]
#: Every rule with the codes it raises, in registration order (the order findings are reported).
RULES: list[tuple[Rule, tuple[Code, ...]]] = []


def rule(*codes: Code) -> Callable[[Rule], Rule]:
    """Register the decorated function as a rule that raises ``codes`` (each a rule code)."""
    wrong = [code for code in codes if code.kind is not Kind.RULE]
    if not codes or wrong:
        raise ValueError(f"a rule raises rule codes, got {wrong or 'none'}")

    def register(function: Rule) -> Rule:
        RULES.append((function, codes))
        return function

    return register


def type_name(value: Any) -> str:
    """How a finding names the YAML type of ``value``."""
    return "null" if value is None else type(value).__name__


def truthy(value: Any) -> bool:
    """``bool(value)`` as Megatron would read it; a value whose ``__bool__`` fails counts as on."""
    try:
        return bool(value)
    except Exception:
        return True
