"""Binding a training contract to a rollout contract under a mandate.

``bind(training, rollout, mandate)`` compares the two contracts tier by tier:

* identity: both sides equal, bit for bit (numbers by exact value, no tolerance); the behaviour
  fields (``rope``, ``mask``, ``softmax``: what the live modules compute) are equal when
  ``binding.behaviour_difference`` finds no difference, and where one is measured on both sides the configuration
  fields that describe it (``FieldSpec.explained_by``) explain it instead of binding on their own;
* semantic: both sides equal each other and the mandate; ``dtype`` may differ when
  ``allow_dtype_difference`` is set (a deliberate sweep, e.g. BF16 rollout against an FP32 reference);
* recorded: every difference is listed, none rejected.

A field whose value was not observed or configured on some side (``unobservable``, ``pending``) is
never reported as matching: it is ``not_comparable``. ``passed`` (no field and no blocking
determinism variable disagrees) is kept apart from ``comparable`` (every identity and semantic field
was compared on known values); the verdict is ``pass``, ``incomparable`` or ``fail``.
Every non-match carries a stable ``Code`` (``codes.Code``, which also gives its severity). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nemo_rl_attn_align.binding.behaviour_difference import difference
from nemo_rl_attn_align.contract.contract import AttentionContract, FieldValue
from nemo_rl_attn_align.kernels.record_kernel_pair import KernelPair, kernel_pair
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding
from nemo_rl_attn_align.vocab.mandate import Mandate
from nemo_rl_attn_align.vocab.schema import Provenance, Tier, field_spec, fields_of


class DeterminismEntryView(Protocol):
    """What the binding reads of one determinism entry (``determinism.DeterminismEntry``)."""

    @property
    def name(self) -> str: ...

    @property
    def blocking(self) -> bool: ...


class DeterminismView(Protocol):
    """What the binding reads of a determinism comparison (``determinism.compare`` returns a
    ``DeterminismDiff``), declared here so that the binding imports nothing from ``determinism``."""

    @property
    def entries(self) -> Sequence[DeterminismEntryView]: ...

    @property
    def blocking(self) -> bool: ...

    def findings(self) -> list[Finding]: ...

    def to_dict(self) -> dict[str, Any]: ...


class Status(str, enum.Enum):
    """Outcome for one field."""

    MATCH = "match"
    MISMATCH = "mismatch"
    ALLOWED = "allowed"  # dtype differs and allow_dtype_difference is set
    DIFFERENT = "different"  # recorded tier: listed, never rejected
    NOT_COMPARABLE = "not_comparable"


class Verdict(str, enum.Enum):
    """``fail``: something disagrees; ``incomparable``: nothing disagrees but some identity or
    semantic field could not be compared; ``pass``: everything compared and agreed."""

    PASS = "pass"
    INCOMPARABLE = "incomparable"
    FAIL = "fail"


def same_value(a: Any, b: Any) -> bool:
    """Exact equality of two JSON values: bools only equal bools, numbers by exact value and sign,
    lists element by element, objects key by key. No tolerance anywhere."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class FieldResult:
    """The verdict on one field: its status, the code (when not a plain match), both sides' values
    and the mandate's demand (``None`` when the tier has none); ``fix`` where this difference has its
    own, and ``explained_by``: the behaviour field this configuration field only explains (bound as a
    recorded field: it neither fails nor leaves the binding incomparable)."""

    name: str
    tier: Tier
    status: Status
    code: Code | None
    training: FieldValue
    rollout: FieldValue
    demand: Any
    message: str
    fix: str = ""
    explained_by: str | None = None

    @property
    def binds(self) -> bool:
        """Whether this result decides the verdict: identity and semantic fields, except configuration
        fields a measured behaviour explains and behaviour fields not measured on both sides (the
        configuration fields then bind on their own, as for an engine without module readback)."""
        unmeasured = self.name in BEHAVIOUR_FIELDS and self.status is Status.NOT_COMPARABLE
        return self.tier is not Tier.RECORDED and self.explained_by is None and not unmeasured

    def to_dict(self) -> dict[str, Any]:
        out = {
            "field": self.name,
            "tier": self.tier.value,
            "status": self.status.value,
            "code": self.code.value if self.code else None,
            "training": self.training.to_dict(),
            "rollout": self.rollout.to_dict(),
            "mandate": self.demand,
            "message": self.message,
        }
        return out | ({"explained_by": self.explained_by} if self.explained_by else {})


@dataclass(frozen=True)
class _Sides:
    """One field as both sides hold it, with the mandate's demand (semantic tier only): what every
    ``FieldResult`` of that field shares."""

    name: str
    tier: Tier
    t: FieldValue
    r: FieldValue
    demand: Any
    explained_by: str | None = None

    @property
    def both_known(self) -> bool:
        return self.t.known and self.r.known

    def result(self, status: Status, code: Code | None, message: str, fix: str = "") -> FieldResult:
        return FieldResult(
            self.name, self.tier, status, code, self.t, self.r, self.demand, message, fix, self.explained_by
        )

    def match(self) -> FieldResult:
        return self.result(Status.MATCH, None, f"{self.name}: {self.t.value!r} on both sides")

    def not_comparable(self) -> FieldResult:
        """Some side is not known: pending (a preview) or unobservable, with each unknown side's source."""
        unknown = [(side, fv) for side, fv in (("training", self.t), ("rollout", self.r)) if not fv.known]
        pending = all(fv.provenance is Provenance.PENDING for _, fv in unknown)
        why = "; ".join(
            f"{side} is {fv.provenance.value}" + (f" ({fv.source})" if fv.source else "") for side, fv in unknown
        )
        code = Code.ATTN_PENDING if pending else Code.ATTN_UNOBSERVABLE
        return self.result(Status.NOT_COMPARABLE, code, f"{self.name}: not comparable: {why}")


def _bind_field(
    name: str, t: FieldValue, r: FieldValue, mandate: Mandate | None, allow_dtype: bool, measured: frozenset[str]
) -> FieldResult:
    """Field ``name`` bound under its tier's rule (``measured``: the behaviour fields known on both sides)."""
    spec = field_spec(name)
    if spec.tier is Tier.SEMANTIC:
        demand = mandate.demand(name) if mandate is not None else None
        return _bind_semantic(_Sides(name, spec.tier, t, r, demand), allow_dtype)
    if name in BEHAVIOUR_FIELDS:
        return _bind_behaviour(_Sides(name, spec.tier, t, r, None))
    explained = spec.explained_by if spec.explained_by in measured else None
    return _bind_equal_or_recorded(_Sides(name, spec.tier, t, r, None, explained))


def _bind_behaviour(s: _Sides) -> FieldResult:
    """A behaviour field: the same function on both sides, or the first place they differ."""
    if not s.both_known:
        return s.not_comparable()
    found = difference(s.name, s.t.value, s.r.value)
    if found is None:
        layers = len(s.t.value["layers"])
        return s.result(Status.MATCH, None, f"{s.name}: the same on both sides ({layers} attention layers measured)")
    return s.result(Status.MISMATCH, Code.ATTN_BEHAVIOUR_MISMATCH, found.message, found.fix)


def _bind_equal_or_recorded(s: _Sides) -> FieldResult:
    """Identity: the sides are equal or it is a mismatch; recorded: equal or a listed difference."""
    if not s.both_known:
        return s.not_comparable()
    if same_value(s.t.value, s.r.value):
        return s.match()
    if s.explained_by is not None:
        return s.result(
            Status.DIFFERENT,
            Code.ATTN_EXPLAINED_DIFFERENCE,
            f"{s.name}: training {s.t.value!r}, rollout {s.r.value!r} (configuration; the measured "
            f"{s.explained_by} decides)",
        )
    if s.tier is Tier.RECORDED:
        return s.result(
            Status.DIFFERENT,
            Code.ATTN_RECORDED_DIFFERENCE,
            f"{s.name}: training {s.t.value!r}, rollout {s.r.value!r} (recorded)",
        )
    return s.result(
        Status.MISMATCH, Code.ATTN_IDENTITY_MISMATCH, f"{s.name}: training {s.t.value!r} != rollout {s.r.value!r}"
    )


def _bind_semantic(s: _Sides, allow_dtype: bool) -> FieldResult:
    """The sides must agree with each other and with the mandate; a known side that breaks the
    mandate fails even when the other side is unknown. ``allow_dtype`` lets ``dtype`` differ."""
    against_mandate = [
        (side, fv)
        for side, fv in (("training", s.t), ("rollout", s.r))
        if s.demand is not None and fv.known and not same_value(fv.value, s.demand)
    ]
    sides_differ = s.both_known and not same_value(s.t.value, s.r.value)
    if s.name == "dtype" and allow_dtype:
        if not s.both_known:
            return s.not_comparable()
        if sides_differ or against_mandate:
            return s.result(
                Status.ALLOWED,
                Code.ATTN_DTYPE_DIFFERENCE_ALLOWED,
                f"dtype: training {s.t.value!r}, rollout {s.r.value!r}, mandate {s.demand!r}: "
                "difference allowed (allow_dtype_difference)",
            )
        return s.match()
    if against_mandate:
        broken = ", ".join(f"{side} {fv.value!r}" for side, fv in against_mandate)
        return s.result(
            Status.MISMATCH, Code.ATTN_SEMANTIC_MANDATE, f"{s.name}: {broken}, but the mandate demands {s.demand!r}"
        )
    if sides_differ:
        return s.result(
            Status.MISMATCH,
            Code.ATTN_SEMANTIC_SIDES_DIFFER,
            f"{s.name}: training {s.t.value!r} != rollout {s.r.value!r}",
        )
    if not s.both_known:
        return s.not_comparable()
    return s.match()


def _fix(result: FieldResult) -> str:
    if result.fix:
        return result.fix
    if result.status is Status.MISMATCH:
        return field_spec(result.name).fix
    if result.code is Code.ATTN_PENDING:
        return "known once the engines start; the run report records it"
    if result.code is Code.ATTN_UNOBSERVABLE:
        return "record this field from a runtime readback (observed) to make it comparable"
    return "none needed: recorded so the measured drift can be attributed"


def _values(result: FieldResult) -> str:
    text = f"training={result.training.value!r}, rollout={result.rollout.value!r}"
    return text + (f", mandate={result.demand!r}" if result.demand is not None else "")


@dataclass(frozen=True)
class BindingReport:
    """The binding of one training and one rollout contract: one ``FieldResult`` per field, the
    optional determinism diff, and the derived verdict."""

    training_worker: str
    rollout_worker: str
    results: tuple[FieldResult, ...]
    mandate: Mandate | None
    allow_dtype_difference: bool
    determinism: DeterminismView | None = None
    #: the kernels the two records name (``record_kernel_pair``); its documented pairs join the findings
    kernels: KernelPair | None = None

    def result(self, name: str) -> FieldResult:
        """The result for field ``name``."""
        field_spec(name)
        return next(r for r in self.results if r.name == name)

    def with_status(self, *statuses: Status) -> tuple[FieldResult, ...]:
        return tuple(r for r in self.results if r.status in statuses)

    @property
    def passed(self) -> bool:
        """No identity or semantic field disagrees and no blocking determinism variable differs."""
        blocking = self.determinism is not None and self.determinism.blocking
        return not self.with_status(Status.MISMATCH) and not blocking

    @property
    def comparable(self) -> bool:
        """Every identity and semantic field was compared on observed or configured values."""
        return not any(r.binds for r in self.with_status(Status.NOT_COMPARABLE))

    @property
    def failed_tiers(self) -> list[str]:
        """The tiers that fail the binding (``attention_align.on_mismatch`` acts per tier): those with a
        mismatch, and ``semantic`` for a blocking determinism difference."""
        failed = {r.tier.value for r in self.with_status(Status.MISMATCH)}
        if self.determinism is not None and self.determinism.blocking:
            failed.add(Tier.SEMANTIC.value)
        return [tier.value for tier in Tier if tier.value in failed]

    @property
    def verdict(self) -> Verdict:
        if not self.passed:
            return Verdict.FAIL
        return Verdict.PASS if self.comparable else Verdict.INCOMPARABLE

    def findings(self) -> list[Finding]:
        """One ``Finding`` per field that did not plainly match, then the determinism findings."""
        out = [
            finding(code, f"contract.{r.tier.value}.{r.name}", _values(r), r.message, _fix(r))
            for r in self.results
            if r.status is not Status.MATCH and (code := r.code) is not None  # only a MATCH has no code
        ]
        if self.determinism is not None:
            out.extend(self.determinism.findings())
        return out + list(self.kernels.documented if self.kernels is not None else ())

    def summary_line(self, pending_identity: str | None = None) -> str:
        """One line: the verdict and what drove it. With ``pending_identity``, the identity fields a
        preview leaves pending are that one phrase instead of a list of names (``check`` says once
        why the model is not known)."""
        parts = []
        for label, statuses, binds in (
            ("mismatch", (Status.MISMATCH,), True),
            ("not comparable", (Status.NOT_COMPARABLE,), True),
            ("allowed", (Status.ALLOWED,), True),
            ("recorded difference", (Status.DIFFERENT,), False),
        ):
            results = [r for r in self.with_status(*statuses) if r.binds is binds]
            pending = [r for r in results if r.tier is Tier.IDENTITY and r.code is Code.ATTN_PENDING]
            if pending_identity is not None and label == "not comparable" and pending:
                parts.append(pending_identity)
                results = [r for r in results if r not in pending]
            names = [r.name for r in results]
            if names:
                parts.append(f"{len(names)} {label} ({', '.join(names)})")
        if self.determinism is not None:
            blocking = [e.name for e in self.determinism.entries if e.blocking]
            if blocking:
                parts.append(f"{len(blocking)} blocking determinism difference ({', '.join(blocking)})")
        return f"{self.verdict.value}: " + ("; ".join(parts) if parts else "every field compared and agreed")

    def to_dict(self) -> dict[str, Any]:
        return {
            "training_worker": self.training_worker,
            "rollout_worker": self.rollout_worker,
            "verdict": self.verdict.value,
            "passed": self.passed,
            "comparable": self.comparable,
            "summary": self.summary_line(),
            "failed_tiers": self.failed_tiers,
            "mandate": self.mandate.to_dict() if self.mandate is not None else None,
            "allow_dtype_difference": self.allow_dtype_difference,
            "fields": [r.to_dict() for r in self.results],
            "determinism": self.determinism.to_dict() if self.determinism is not None else None,
            "kernel_pair": self.kernels.to_dict() if self.kernels is not None else None,
            "findings": [f.to_dict() for f in self.findings()],
        }


def _with_explanation(result: FieldResult, results: Sequence[FieldResult]) -> FieldResult:
    """A behaviour mismatch with what the configuration fields it measures read on each side."""
    if result.name not in BEHAVIOUR_FIELDS or result.status is not Status.MISMATCH:
        return result
    read = [
        f"{r.name} {r.training.value!r} on both sides"
        if r.status is Status.MATCH
        else f"{r.name} training {r.training.value!r}, rollout {r.rollout.value!r}"
        for r in results
        if r.explained_by == result.name and r.training.known and r.rollout.known
    ]
    if not read:
        return result
    return dataclasses.replace(result, message=f"{result.message}; configuration read: {'; '.join(read)}")


def bind(
    training: AttentionContract,
    rollout: AttentionContract,
    mandate: Mandate | None = None,
    *,
    allow_dtype_difference: bool = False,
    determinism: DeterminismView | None = None,
) -> BindingReport:
    """Bind ``training`` to ``rollout`` under ``mandate`` (``None``: no semantic demand, the sides
    must still agree). ``determinism`` (from ``determinism.compare``) joins the verdict: a blocking
    difference fails the binding."""
    for label, contract in (("training", training), ("rollout", rollout)):
        if not isinstance(contract, AttentionContract):
            raise TypeError(f"{label} must be an AttentionContract, got {type(contract).__name__}")
    order = fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC) + fields_of(Tier.RECORDED)
    measured = frozenset(name for name in BEHAVIOUR_FIELDS if training[name].known and rollout[name].known)
    results = tuple(
        _bind_field(name, training[name], rollout[name], mandate, allow_dtype_difference, measured) for name in order
    )
    results = tuple(_with_explanation(result, results) for result in results)
    kernels = kernel_pair(training, rollout)
    return BindingReport(
        training.worker_id, rollout.worker_id, results, mandate, allow_dtype_difference, determinism, kernels
    )
