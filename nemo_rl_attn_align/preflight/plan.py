"""The backend plan: what Megatron will do with the attention settings, and whether it can work.

``build_plan(facts)`` takes a whole recipe's ``RecipeFacts``; ``build_plan_for_policy(policy_cfg)``
takes only a ``policy`` section, which is what a Megatron policy worker receives. Both see the
environment the worker will see: the process environment overlaid with
``policy.megatron_cfg.env_vars`` (NeMo-RL gives env_vars precedence over the driver's environment).
The policy is read once into ``facts.PolicyFacts``, which the rules evaluate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.preflight.backend import NVTE_BY_BACKEND
from nemo_rl_attn_align.preflight.facts import UNSET, PolicyFacts, read_policy_facts
from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts
from nemo_rl_attn_align.preflight.rules import evaluate
from nemo_rl_attn_align.vocab.errors import Finding, RuleViolation, Severity, json_value


@dataclass(frozen=True)
class BackendPlan:
    """What Megatron will do with the attention settings, and every rule's verdict on them."""

    megatron_enabled: bool
    requested: Any  # the YAML value as written (valid or not); None when unset or null
    effective: str | None  # the AttnBackend member in effect; None when the request is invalid
    precision: str | None
    nvte: dict[str, str]  # what Megatron's _set_attention_backend will set
    nvte_existing: dict[str, tuple[str, str]]  # NVTE_* already present: value and source
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        """The error-level findings: any one means the configuration cannot work."""
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        """The warning-level findings."""
        return [f for f in self.findings if f.severity is Severity.WARNING]

    @property
    def ok(self) -> bool:
        """True when no rule found an error (warnings allowed)."""
        return not self.errors

    @property
    def attn_backend(self) -> str | None:
        """The megatron-core enum spelling, e.g. ``AttnBackend.flash``."""
        return f"AttnBackend.{self.effective}" if self.effective else None

    def raise_for_errors(self) -> None:
        """Raise ``RuleViolation`` carrying the error findings, if there are any."""
        if self.errors:
            raise RuleViolation(self.errors)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "megatron_enabled": self.megatron_enabled,
            "requested": json_value(self.requested),
            "effective": self.effective,
            "attn_backend": self.attn_backend,
            "source": "unset: megatron-core default"
            if self.requested is None
            else "policy.megatron_cfg.attention_backend",
            "precision": self.precision,
            "nvte": dict(self.nvte),
            "nvte_existing": {k: {"value": v, "source": s} for k, (v, s) in self.nvte_existing.items()},
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
        }


def build_plan_for_policy(policy_cfg: Any, environ: Mapping[str, str] | None = None) -> BackendPlan:
    """Plan and rule verdicts for one resolved ``policy`` section (what a Megatron worker receives)."""
    return _plan(read_policy_facts(policy_cfg, environ))


def _plan(facts: PolicyFacts) -> BackendPlan:
    effective = facts.effective_backend if facts.megatron_enabled else None
    return BackendPlan(
        megatron_enabled=facts.megatron_enabled,
        requested=None if facts.backend_raw is UNSET else facts.backend_raw,
        effective=effective,
        precision=facts.precision,
        nvte=dict(NVTE_BY_BACKEND[effective]) if effective else {},
        nvte_existing=dict(facts.nvte_env),
        findings=evaluate(facts),
    )


def build_plan(facts: RecipeFacts) -> BackendPlan:
    """Plan and rule verdicts for a whole recipe."""
    return _plan(facts.require_policy())
