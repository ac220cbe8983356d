"""The contract object: ``AttentionContract`` (every field of ``schema.FIELDS`` with its
``FieldValue``: value, provenance, source) and ``ContractBuilder``, which the preview and the
workers' hooks fill one field at a time. ``to_dict``/``from_dict`` round-trip exactly through
JSON. Stdlib only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.schema import (
    CONTRACT_SCHEMA_VERSION,
    FIELD_NAMES,
    FIELDS_ADDED,
    SIDES,
    ContractError,
    Provenance,
    field_spec,
)


@dataclass(frozen=True)
class FieldValue:
    """A field's value, how it was known, and where it was read (``source``, free text).

    For ``unobservable`` the value is what was requested (or null); for ``pending`` it is null.
    Build with the class methods; ``ContractBuilder`` validates the value against the field.
    """

    value: Any
    provenance: Provenance
    source: str = ""

    @classmethod
    def observed(cls, value: Any, source: str = "") -> FieldValue:
        return cls(value, Provenance.OBSERVED, source)

    @classmethod
    def configured(cls, value: Any, source: str = "") -> FieldValue:
        return cls(value, Provenance.CONFIGURED, source)

    @classmethod
    def unobservable(cls, requested: Any = None, source: str = "") -> FieldValue:
        return cls(requested, Provenance.UNOBSERVABLE, source)

    @classmethod
    def pending(cls, source: str = "") -> FieldValue:
        return cls(None, Provenance.PENDING, source)

    @property
    def known(self) -> bool:
        """True when the value can take part in a comparison."""
        return self.provenance.known

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "provenance": self.provenance.value, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "field") -> FieldValue:
        if not isinstance(data, Mapping) or set(data) != {"value", "provenance", "source"}:
            raise ContractError(f"{where}: expected an object with value, provenance and source, got {data!r}")
        try:
            provenance = Provenance(data["provenance"])
        except ValueError:
            choices = ", ".join(p.value for p in Provenance)
            raise ContractError(f"{where}: provenance {data['provenance']!r} is not one of {choices}") from None
        if not isinstance(data["source"], str):
            raise ContractError(f"{where}: source must be a string, got {data['source']!r}")
        return cls(data["value"], provenance, data["source"])


def _validated(name: str, fv: FieldValue) -> FieldValue:
    """``fv`` with its value in canonical form for field ``name``."""
    spec = field_spec(name)
    if not isinstance(fv, FieldValue):
        raise ContractError(f"field {name}: expected a FieldValue, got {fv!r}")
    if fv.provenance is Provenance.PENDING:
        if fv.value is not None:
            raise ContractError(f"field {name}: a pending field has no value yet (got {fv.value!r})")
        return fv
    if fv.provenance is Provenance.UNOBSERVABLE and fv.value is None:
        return fv
    if fv.known and fv.value is None and not spec.nullable:
        raise ContractError(
            f"field {name}: {fv.provenance.value} needs a value; use FieldValue.pending or unobservable"
        )
    return FieldValue(spec.validate(fv.value), fv.provenance, fv.source)


def _check_worker_id(worker_id: Any) -> None:
    if not isinstance(worker_id, str) or not worker_id:
        raise ContractError(f"worker_id must be a non-empty string, got {worker_id!r}")


def _fields_dict(fields: Mapping[str, FieldValue]) -> dict[str, Any]:
    return {name: fv.to_dict() for name, fv in fields.items()}


# --- the contract ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionContract:
    """What one worker's attention computes: every field of ``FIELDS`` with its provenance.

    ``side`` is ``training`` or ``rollout``; ``worker_id`` names the worker (e.g. ``policy-rank0``).
    """

    side: str
    worker_id: str
    fields: Mapping[str, FieldValue]
    schema_version: int = CONTRACT_SCHEMA_VERSION

    def __post_init__(self):
        if self.side not in SIDES:
            raise ContractError(f"side {self.side!r} is not one of {', '.join(SIDES)}")
        _check_worker_id(self.worker_id)
        if self.schema_version != CONTRACT_SCHEMA_VERSION:
            raise ContractError(
                f"contract schema_version {self.schema_version!r} is not supported (this version reads "
                f"{CONTRACT_SCHEMA_VERSION})"
            )
        missing = [name for name in FIELD_NAMES if name not in self.fields]
        if missing:
            raise ContractError(f"contract lacks fields: {', '.join(missing)}")
        for name in self.fields:
            field_spec(name)
        ordered = {name: _validated(name, self.fields[name]) for name in FIELD_NAMES}
        object.__setattr__(self, "fields", ordered)

    def __getitem__(self, name: str) -> FieldValue:
        field_spec(name)
        return self.fields[name]

    def __iter__(self) -> Iterator[tuple[str, FieldValue]]:
        return iter(self.fields.items())

    def value(self, name: str) -> Any:
        """The value of field ``name`` (whatever its provenance)."""
        return self[name].value

    def known_value(self, name: str) -> Any:
        """The value of field ``name`` when it is known (observed or configured), else None."""
        return self[name].value if self[name].known else None

    def replace(self, **changes: FieldValue) -> AttentionContract:
        """A copy with some fields replaced (``name=FieldValue``)."""
        for name in changes:
            field_spec(name)
        return AttentionContract(self.side, self.worker_id, {**self.fields, **changes})

    def renamed(self, worker_id: str) -> AttentionContract:
        """This contract as worker ``worker_id`` recorded it: the same fields, already validated and
        shared (the records of many workers that run one contract are checked once)."""
        _check_worker_id(worker_id)
        clone = copy.copy(self)
        object.__setattr__(clone, "worker_id", worker_id)
        return clone

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``from_dict(to_dict(c)) == c``."""
        return self._with_fields(_fields_dict(self.fields))

    def _with_fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "side": self.side, "worker_id": self.worker_id, "fields": fields}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionContract:
        """Inverse of ``to_dict``; any deviation from the schema raises ``ContractError``."""
        if not isinstance(data, Mapping):
            raise ContractError(f"a contract must be a JSON object, got {type(data).__name__}")
        expected = {"schema_version", "side", "worker_id", "fields"}
        if set(data) != expected:
            extra = sorted(set(data) - expected)
            missing = sorted(expected - set(data))
            raise ContractError(f"contract keys: missing {missing}, unexpected {extra}")
        if not isinstance(data["fields"], Mapping):
            raise ContractError("contract fields must be a JSON object")
        fields = {name: FieldValue.from_dict(raw, f"field {name}") for name, raw in data["fields"].items()}
        version = data["schema_version"]
        if type(version) is int and 1 <= version < CONTRACT_SCHEMA_VERSION:  # lacks the newer fields
            unread = FieldValue(None, Provenance.UNOBSERVABLE, f"not recorded (contract schema {version})")
            added = [name for since, names in FIELDS_ADDED.items() if since > version for name in names]
            fields = {**dict.fromkeys(added, unread), **fields}
            version = CONTRACT_SCHEMA_VERSION
        return cls(data["side"], data["worker_id"], fields, version)

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AttentionContract:
        try:
            data = jsonio.loads(text, "contract")
        except ValueError as err:  # not JSON, or not strict JSON
            raise ContractError(f"contract is not valid JSON: {err}") from None
        return cls.from_dict(data)


def contract_dicts(contracts: Iterable[AttentionContract]) -> list[dict[str, Any]]:
    """``[c.to_dict() for c in contracts]``, where contracts that share their fields (``renamed``)
    share one fields dict: a report of 10,000 workers that run one contract holds it once."""
    shared: dict[int, dict[str, Any]] = {}
    out = []
    for contract in contracts:
        fields = shared.get(id(contract.fields))
        if fields is None:
            fields = shared[id(contract.fields)] = _fields_dict(contract.fields)
        out.append(contract._with_fields(fields))
    return out


@dataclass
class ContractBuilder:
    """Fills a contract one field at a time; fields left unset become ``unobservable``.

    >>> b = ContractBuilder("training", "policy-rank0")
    >>> b.observed("num_attention_heads", 16, "TransformerConfig.num_attention_heads")  # doctest: +ELLIPSIS
    <...>
    >>> contract = b.build(unset_source="not recorded by this host")

    Each setter validates the value at once, so a wrong value fails where it was recorded.
    """

    side: str
    worker_id: str
    _fields: dict[str, FieldValue] = field(default_factory=dict)

    def set(self, name: str, fv: FieldValue) -> ContractBuilder:
        """Set field ``name`` to ``fv`` (validated now)."""
        self._fields[name] = _validated(name, fv)
        return self

    def observed(self, name: str, value: Any, source: str = "") -> ContractBuilder:
        return self.set(name, FieldValue.observed(value, source))

    def configured(self, name: str, value: Any, source: str = "") -> ContractBuilder:
        return self.set(name, FieldValue.configured(value, source))

    def unobservable(self, name: str, requested: Any = None, source: str = "") -> ContractBuilder:
        return self.set(name, FieldValue.unobservable(requested, source))

    def pending(self, name: str, source: str = "") -> ContractBuilder:
        return self.set(name, FieldValue.pending(source))

    def unknown(self, name: str, why: str, preview: bool) -> ContractBuilder:
        """A field a rule cannot know: pending in a preview, unobservable in a worker's record."""
        return self.pending(name, why) if preview else self.unobservable(name, None, why)

    def build(
        self, unset: Provenance = Provenance.UNOBSERVABLE, unset_source: str = "not recorded"
    ) -> AttentionContract:
        """The contract; every field not set gets ``unset`` provenance (unobservable or pending)."""
        if unset not in (Provenance.UNOBSERVABLE, Provenance.PENDING):
            raise ContractError("fields left unset can only be unobservable or pending")
        filler = FieldValue(None, unset, unset_source)
        return AttentionContract(
            self.side, self.worker_id, {name: self._fields.get(name, filler) for name in FIELD_NAMES}
        )


def put_field(builder: ContractBuilder, name: str, value: Any, source: str, how: str = "observed") -> None:
    """Set one contract field on ``builder``; a missing observed value, or one the schema rejects,
    is recorded as unobservable with the reason, never guessed."""
    if value is None and how == "observed":
        builder.unobservable(name, None, f"{source}: not available in this host")
        return
    try:
        getattr(builder, how)(name, value, source)
    except ContractError as err:
        builder.unobservable(name, None, f"{source}: {err}")


def configured_from(b: ContractBuilder, name: str, value: Any, key: str) -> None:
    """``name`` configured from config key ``key`` (a preview); pending when the key is unset (the
    engine's default applies) or holds a value the field cannot take (the pre-flight rules report it)."""
    if value is None:
        b.pending(name, f"{key} not set: the engine's default")
        return
    try:
        b.configured(name, value, key)
    except ContractError as err:
        b.pending(name, f"{key}={value!r} is not usable: {err}")
