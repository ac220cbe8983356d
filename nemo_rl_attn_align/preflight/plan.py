"""The backend plan: what Megatron will do with the attention settings, and whether it can work.

``build_plan(cfg)`` takes a whole resolved NeMo-RL config (as ``config.load_config`` returns it);
``build_plan_for_policy(policy_cfg)`` takes only its ``policy`` section, which is what a Megatron
policy worker receives. Both read the environment the worker will see: the process environment
overlaid with ``policy.megatron_cfg.env_vars`` (NeMo-RL gives env_vars precedence over the driver's
environment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES, NVTE_BY_BACKEND, NVTE_VARIABLES
from nemo_rl_attn_align.errors import Finding, RuleViolation, Severity, UsageError, json_value
from nemo_rl_attn_align.preflight.rules import TRANSFORMER_IMPLS, UNSET, PolicyFacts, evaluate, is_count


def _get(node: Any, key: str) -> Any:
    return node.get(key, UNSET) if isinstance(node, dict) else UNSET


def _nvte_env(megatron_cfg: Any, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    env_vars = _get(megatron_cfg, "env_vars")
    env_vars = env_vars if isinstance(env_vars, dict) else {}  # another value is a CONFIG_VALUE_INVALID finding
    found = {}
    for name in NVTE_VARIABLES:
        if name in env_vars and env_vars[name] is not None:
            found[name] = (str(env_vars[name]), f"policy.megatron_cfg.env_vars.{name}")
        elif name in environ:
            found[name] = (environ[name], f"environment {name}")
    return found


def megatron_enabled(policy_cfg: Any) -> bool:
    """Whether NeMo-RL uses the Megatron backend for this policy, decided as NeMo-RL decides it
    (``lm_policy.py``: ``bool(config.get("megatron_cfg", {}).get("enabled", False))``): any truthy
    ``enabled`` counts (``1``, ``"yes"``, even ``"false"``); a ``megatron_cfg`` that is not a mapping
    counts as disabled (NeMo-RL fails on it itself)."""
    megatron_cfg = _get(policy_cfg, "megatron_cfg")
    return isinstance(megatron_cfg, dict) and bool(megatron_cfg.get("enabled", False))


def read_policy_facts(policy_cfg: Any, environ: Mapping[str, str] | None = None) -> PolicyFacts:
    """Read what the rules need from a resolved ``policy`` section and the worker's environment."""
    if not isinstance(policy_cfg, dict):
        raise UsageError(
            f"policy is {type(policy_cfg).__name__}, not a mapping. Fix: a NeMo-RL config needs a `policy:` section."
        )
    environ = os.environ if environ is None else environ
    megatron_cfg = _get(policy_cfg, "megatron_cfg")
    backend_raw = _get(megatron_cfg, "attention_backend")
    overrides = _get(megatron_cfg, "model_overrides")
    cp = _get(megatron_cfg, "context_parallel_size")
    impl = _get(megatron_cfg, "transformer_impl")
    model_name = _get(policy_cfg, "model_name")
    return PolicyFacts(
        megatron_enabled=megatron_enabled(policy_cfg),
        backend_raw=backend_raw,
        backend=backend_raw if isinstance(backend_raw, str) and backend_raw in BACKEND_NAMES else None,
        precision_raw=_get(policy_cfg, "precision"),
        pipeline_dtype_raw=_get(megatron_cfg, "pipeline_dtype"),
        transformer_impl=impl if isinstance(impl, str) and impl in TRANSFORMER_IMPLS else "transformer_engine",
        context_parallel_size=int(cp) if is_count(cp) else 1,
        model_name=model_name if isinstance(model_name, str) else None,
        model_overrides=overrides if isinstance(overrides, dict) else {},
        nvte_env=_nvte_env(megatron_cfg, environ),
        raw={"megatron_cfg": _get(policy_cfg, "megatron_cfg"), "model_name": model_name, "transformer_impl": impl,
             "context_parallel_size": cp, "model_overrides": overrides, "env_vars": _get(megatron_cfg, "env_vars")},
    )


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
            "source": "unset: megatron-core default" if self.requested is None else "policy.megatron_cfg.attention_backend",
            "precision": self.precision,
            "nvte": dict(self.nvte),
            "nvte_existing": {k: {"value": v, "source": s} for k, (v, s) in self.nvte_existing.items()},
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
        }


def build_plan_for_policy(policy_cfg: Any, environ: Mapping[str, str] | None = None) -> BackendPlan:
    """Plan and rule verdicts for one resolved ``policy`` section (what a Megatron worker receives)."""
    facts = read_policy_facts(policy_cfg, environ)
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


def build_plan(cfg: Any, environ: Mapping[str, str] | None = None) -> BackendPlan:
    """Plan and rule verdicts for a whole resolved NeMo-RL config."""
    if not isinstance(cfg, dict) or "policy" not in cfg:
        raise UsageError("the config has no `policy:` section. Fix: pass a NeMo-RL recipe config (GRPO, SFT, DPO, ...).")
    return build_plan_for_policy(cfg["policy"], environ)
