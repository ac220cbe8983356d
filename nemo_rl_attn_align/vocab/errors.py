"""Errors and findings shared by every part of the plugin.

Two kinds of failure exist, and the CLI maps them to exit codes:

* ``UsageError`` (exit 2): the input cannot be used at all (missing file, YAML syntax error,
  bad override, ...). Its message is one line naming what is wrong and how to fix it.
* ``RuleViolation`` (exit 1): the input is readable but describes a configuration that cannot
  work. It carries the ``Finding`` objects that say which rule, which key, which value, which fix.

Both are ``ValueError`` subclasses: raised inside NeMo-RL's processes (the driver's ``setup``, the
Megatron worker) they have the type NeMo-RL itself raises for a bad config, and their message starts
with ``PLUGIN_PREFIX`` so a reader of NeMo-RL's traceback knows where the stop came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.vocab.codes import Code, Severity, code_of
from nemo_rl_attn_align.vocab.limits import shown, shown_text


def json_value(value: Any) -> Any:
    """``value`` itself when it is a strict-JSON scalar, else its ``repr`` (so any value can be
    reported: a NaN or infinite float becomes ``'nan'`` / ``'inf'``, never invalid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth) replaced by its ``repr``, so
    ``json.dumps(..., allow_nan=False)`` always succeeds on what ``check --json`` prints."""
    if isinstance(value, float):
        return json_value(value)
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def format_finding(finding: Mapping[str, Any]) -> str:
    """One human-readable line for a finding in its dict form (``Finding.to_dict()``); long values
    are cut and control characters escaped, so it stays one readable line."""
    return (
        f"{finding['severity']} {finding['code']}: {shown_text(str(finding['key']))}={shown(finding['value'])}: "
        f"{shown_text(str(finding['message']), 1000)} Fix: {shown_text(str(finding['fix']), 1000)}"
    )


#: How every error the plugin raises inside a host process names its origin.
PLUGIN_PREFIX = "nemo-rl-attn-align: "


class UsageError(ValueError):
    """Input that cannot be used at all; ``str(err)`` is one line naming the problem and the fix."""


@dataclass(frozen=True)
class Finding:
    """One verdict on one key: a stable ``code``, the key and value it is about, and the fix.

    Made with ``finding`` (which takes the severity from the code); ``from_dict`` reads one back
    from a report. ``Severity`` is defined in ``codes`` with the registry and re-exported here."""

    code: Code
    severity: Severity
    key: str
    value: Any
    message: str
    fix: str

    def line(self) -> str:
        """The finding as one human-readable line."""
        return format_finding(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``value`` passed through ``repr`` when it is not a JSON scalar)."""
        return {
            "code": self.code.value,
            "severity": self.severity.value,
            "key": self.key,
            "value": json_value(self.value),
            "message": self.message,
            "fix": self.fix,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """The finding a report holds in its dict form (``to_dict``); ValueError for a code or
        severity this version does not know (codes are never renamed, so older reports read back)."""
        return cls(
            code_of(data["code"]),
            Severity(data["severity"]),
            data["key"],
            data["value"],
            data["message"],
            data["fix"],
        )


def finding(code: Code, key: str, value: Any, message: str, fix: str, *, severity: Severity | None = None) -> Finding:
    """The one way to make a ``Finding``: its severity is the code's own (``codes.Code``).

    ``severity`` only for a code whose severity varies (``Code.varies``; e.g. ``REPORT_SIDE_MISSING``),
    where it is required; ValueError otherwise, so a hard-coded severity cannot drift from the registry."""
    if code.varies:
        if severity is None:
            raise ValueError(f"{code.value}: the severity varies ({code.severity_text}); pass severity=")
        return Finding(code, severity, key, value, message, fix)
    if severity is not None:
        raise ValueError(f"{code.value} has severity {code.severity.value}; do not pass severity=")
    return Finding(code, code.severity, key, value, message, fix)


class RuleViolation(ValueError):
    """A configuration that cannot work; carries the error-level findings that say why.

    ``str(err)`` is one line: ``PLUGIN_PREFIX`` then the findings' lines joined by ``; ``."""

    def __init__(self, findings: list[Finding]):
        self.findings = list(findings)
        super().__init__(PLUGIN_PREFIX + "; ".join(f.line() for f in self.findings))
