"""The worker files of one report folder, read back: typed, frozen values the report is built from.

``store.read_worker_files`` returns a ``WorkerFiles``: each worker's ``WorkerRecord`` (its contract
and determinism probe), each worker's ``HostDetail`` (what its host hook saw), and the files that
could not be used (unreadable, half-written, another run's). ``document.build_report`` and
``workers`` read only these. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.binding.determinism_probe import DeterminismProbe
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.vocab.errors import Finding
from nemo_rl_attn_align.vocab.schema import SIDES

#: A worker by ``(side, worker_id)``.
WorkerKey = tuple[str, str]


@dataclass(frozen=True)
class WorkerRecord:
    """One worker's record file: the contract it runs and its determinism probe (None: it read none)."""

    contract: AttentionContract
    probe: DeterminismProbe | None
    run_id: str | None = None

    @property
    def side(self) -> str:
        return self.contract.side

    @property
    def worker_id(self) -> str:
        return self.contract.worker_id

    @property
    def key(self) -> WorkerKey:
        return (self.contract.side, self.contract.worker_id)


#: The host-detail keys the report reads; every other key is kept, for humans, in ``HostDetail.rest``.
DETAIL_KEYS = ("kind", "side", "worker_id", "run_id", "stage", "host", "findings", "coded_findings", "peers")
#: What each finding a host detail's ``coded_findings`` holds has as a string (``Finding.to_dict``).
_FINDING_STRINGS = ("code", "severity", "key", "message", "fix")


@dataclass(frozen=True)
class HostDetail:
    """What one worker's host hook saw: the ``stage`` it reached, its ``findings`` (lines, e.g.
    Transformer Engine ran another backend than requested), its ``coded_findings`` (findings with
    their own code, e.g. ``PACKED_BOUNDARIES_DROPPED``), the ``peers`` its group should have, and
    ``rest``: everything else it wrote (its config, plan, read-back), kept as written."""

    side: str
    worker_id: str
    run_id: str | None = None
    stage: str | None = None
    host: str | None = None
    findings: tuple[str, ...] = ()
    coded_findings: tuple[Finding, ...] = ()
    peers: tuple[str, ...] = ()
    rest: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> WorkerKey:
        return (self.side, self.worker_id)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostDetail:
        """A host detail as written (``store.write_worker_detail``); ``ValueError`` naming the key
        that is missing or of the wrong type."""
        if data.get("side") not in SIDES or not isinstance(data.get("worker_id"), str):
            raise ValueError("a host detail needs side (training or rollout) and worker_id")
        for key, kinds in (
            ("run_id", (str, type(None))),
            ("stage", (str, type(None))),
            ("host", (str, type(None))),
            ("findings", (list, type(None))),
            ("coded_findings", (list, type(None))),
            ("peers", (list, type(None))),
        ):
            if not isinstance(data.get(key), kinds):
                raise ValueError(
                    f"host detail {key} is {type(data.get(key)).__name__}, not {' or '.join(k.__name__ for k in kinds)}"
                )
        for key in ("findings", "peers"):
            if not all(isinstance(item, str) for item in data.get(key) or []):
                raise ValueError(f"host detail {key} holds a value that is not a string")
        return cls(
            side=data["side"],
            worker_id=data["worker_id"],
            run_id=data.get("run_id"),
            stage=data.get("stage"),
            host=data.get("host"),
            findings=tuple(data.get("findings") or ()),
            coded_findings=_coded_findings(data.get("coded_findings") or []),
            peers=tuple(data.get("peers") or ()),
            rest={key: value for key, value in data.items() if key not in DETAIL_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The detail as its file holds it (less ``kind``)."""
        return {
            "side": self.side,
            "worker_id": self.worker_id,
            "run_id": self.run_id,
            "stage": self.stage,
            "host": self.host,
            "findings": list(self.findings),
            "coded_findings": [f.to_dict() for f in self.coded_findings],
            "peers": list(self.peers),
            **self.rest,
        }


def _coded_findings(items: list) -> tuple[Finding, ...]:
    """A host detail's ``coded_findings``; ``ValueError`` naming the first that is not a finding of a
    code this version knows."""
    out = []
    for index, item in enumerate(items):
        where = f"host detail coded_findings[{index}]"
        if not isinstance(item, Mapping) or not all(isinstance(item.get(k), str) for k in _FINDING_STRINGS):
            raise ValueError(f"{where} is not a finding: it needs {', '.join(_FINDING_STRINGS)} as strings")
        try:
            out.append(Finding.from_dict(item))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(out)


@dataclass(frozen=True)
class UnreadableFile:
    """A worker file that could not be used, and why (one line)."""

    path: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "error": self.error}


@dataclass(frozen=True)
class WorkerFiles:
    """Everything one report folder's worker files say: ``records`` sorted by side and worker id,
    ``details`` by ``(side, worker_id)``, ``unreadable`` files, ``incomplete_writes`` (temp files
    left over) and ``stale`` files (another run's, left out when a run id was given)."""

    records: tuple[WorkerRecord, ...] = ()
    details: Mapping[WorkerKey, HostDetail] = field(default_factory=dict)
    unreadable: tuple[UnreadableFile, ...] = ()
    incomplete_writes: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()

    def contracts(self, side: str) -> list[AttentionContract]:
        """The contracts the workers of ``side`` recorded, in worker-id order."""
        return [record.contract for record in self.records if record.side == side]

    def probes(self) -> dict[WorkerKey, DeterminismProbe | None]:
        """``(side, worker_id)`` -> that worker's determinism probe."""
        return {record.key: record.probe for record in self.records}

    def peers(self) -> dict[str, set[str]]:
        """Side -> every worker id its host details name as a peer."""
        peers: dict[str, set[str]] = {}
        for detail in self.details.values():
            peers.setdefault(detail.side, set()).update(detail.peers)
        return peers
