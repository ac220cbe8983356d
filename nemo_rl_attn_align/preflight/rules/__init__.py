"""Pre-flight rules: attention settings that cannot work, caught before any GPU work.

Each rule reads ``PolicyFacts`` (what the policy config and the environment say, already read by
``facts.read_policy_facts``) and returns ``Finding`` objects with a stable ``Code``. A rule is a
function registered with ``@rule(Code.X, ...)`` (``registry.py``; the codes it raises) in
``values.py`` (a value no host can use; most are rows of its ``VALUE_CHECKS`` table) or
``combinations.py`` (values that cannot work together) or ``alignment.py`` (what batch-invariant
training and Megatron generation require) or ``host_start.py`` (what would crash the host at
start). ``evaluate`` runs them in registration order: the values first, then the combinations.
Each code's severity and summary are in ``codes.Code``, which the rule table of docs/rules-and-limits.md is generated
from.
"""

from __future__ import annotations

from nemo_rl_attn_align.preflight.facts import PolicyFacts
from nemo_rl_attn_align.preflight.rules.registry import RULES
from nemo_rl_attn_align.vocab.errors import Finding

# Importing a rule module registers its rules, so the import order is the rule order.
# isort: off
from nemo_rl_attn_align.preflight.rules import values  # noqa: F401
from nemo_rl_attn_align.preflight.rules import combinations  # noqa: F401
from nemo_rl_attn_align.preflight.rules import alignment  # noqa: F401
from nemo_rl_attn_align.preflight.rules import host_start  # noqa: F401

# isort: on


def evaluate(facts: PolicyFacts) -> list[Finding]:
    """Run every rule on ``facts``; findings in rule order."""
    return [f for check, _ in RULES for f in check(facts)]
