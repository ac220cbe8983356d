"""Two determinism probes compared by meaning: what each side's process really runs with.

``determinism_probe.probe()`` records, inside each worker, the determinism environment variables
and torch's flags. ``compare(training, rollout, collective)`` puts two probes side by side:

* ``NCCL_ALGO``, ``NCCL_PROTO`` and ``CUBLAS_WORKSPACE_CONFIG`` block when their *meanings* differ:
  the algorithms (protocols) NCCL may use for the collective that reduces the compared tensor, and
  whether cuBLAS runs with a deterministic workspace (``:4096:8`` and ``:16:8`` both do);
* everything else is recorded.

NCCL list grammar, as NCCL's ``parseList`` reads it (NCCL >= 2.24, ``src/graph/tuning.cc``):
``[^]elem,elem;coll:[^]elem,...`` -- ``;`` separates sections, only the first may lack a
``coll:`` prefix (it then applies to every collective), a later section replaces the list of its
collective, ``^`` enables everything except the listed elements, names are case-insensitive, an
unknown element or collective is an error (NCCL refuses to initialise).

What Megatron's deterministic mode and vLLM's batch-invariant mode do to the environment is in
``binding/profiles.py``. Stdlib only.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_attn_align.binding.determinism_probe import BLOCKING_VARIABLES, DeterminismProbe

# the hosts' workers and contract/contract_preview.py import it from here
from nemo_rl_attn_align.binding.determinism_probe import probe as probe
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import Finding, finding

NCCL_ALGORITHMS = ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
NCCL_COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send", "recv")

# Algorithms NCCL can run each collective with (src/graph/tuning.cc, ncclTopoTuneModel).
_CAPABLE = {
    "broadcast": {"ring"},
    "reduce": {"ring"},
    "allgather": {"ring", "pat", "nvls", "collnetdirect"},
    "reducescatter": {"ring", "pat", "nvls", "collnetdirect"},
    "allreduce": {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree"},
    "sendrecv": set(),
    "send": set(),
    "recv": set(),
}

#: The cuBLAS workspace configs PyTorch's deterministic check accepts.
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")
_CUBLAS_RE = re.compile(r"^(:[0-9]+:[0-9]+)+$")


class NcclSyntaxError(ValueError):
    """A value NCCL's list parser rejects."""


def parse_nccl_list(raw: str, elements: tuple[str, ...]) -> dict[str, frozenset]:
    """The enabled ``elements`` per collective for an ``NCCL_ALGO``/``NCCL_PROTO`` value."""
    enabled = {coll: frozenset(elements) for coll in NCCL_COLLECTIVES}
    for index, section in enumerate(s for s in raw.split(";") if s):
        prefix, sep, items = section.partition(":")
        if not sep:
            if index:
                raise NcclSyntaxError(f"{raw!r}: only the first section may lack a collective prefix")
            prefix, items = "", section
        prefix = prefix.strip().lower()
        if prefix and prefix not in NCCL_COLLECTIVES:
            raise NcclSyntaxError(f"{raw!r}: unknown collective {prefix!r}")
        exclude = items.startswith("^")
        names = {name.strip().lower() for name in items.lstrip("^").split(",") if name.strip()}
        unknown = sorted(names - set(elements))
        if unknown:
            raise NcclSyntaxError(f"{raw!r}: unknown element {unknown[0]!r}")
        chosen = frozenset(set(elements) - names) if exclude else frozenset(names)
        for coll in [prefix] if prefix else NCCL_COLLECTIVES:
            enabled[coll] = chosen
    return enabled


@dataclass(frozen=True)
class Meaning:
    """What a variable's value means for the comparison: a kind and a JSON value."""

    kind: str
    value: Any
    note: str = ""

    def same(self, other: Meaning) -> bool:
        return (self.kind, self.value) == (other.kind, other.value)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "note": self.note}


def _nccl_set(env: Mapping[str, str | None], name: str, elements, collective: str) -> Meaning:
    raw = env.get(name)
    try:
        enabled = set(parse_nccl_list(raw or "", elements)[collective])
    except NcclSyntaxError as err:
        return Meaning("invalid", str(err), "NCCL refuses to initialise with this value")
    note = "unset: NCCL picks by its tuning model" if raw is None else ""
    if name == "NCCL_ALGO":
        enabled &= _CAPABLE[collective]
        if env.get("NCCL_COLLNET_ENABLE") != "1":
            enabled -= {"collnetdirect", "collnetchain"}
        if env.get("NCCL_NVLS_ENABLE") == "0":
            enabled -= {"nvls", "nvlstree"}
    return Meaning(f"{name.lower()}[{collective}]", sorted(enabled), note)


def nccl_algorithms(env: Mapping[str, str | None], collective: str = "allreduce") -> Meaning:
    """Algorithms NCCL may use for ``collective`` under ``env`` (NCCL_ALGO, NCCL_COLLNET_ENABLE,
    NCCL_NVLS_ENABLE together)."""
    return _nccl_set(env, "NCCL_ALGO", NCCL_ALGORITHMS, _collective(collective))


def nccl_protocols(env: Mapping[str, str | None], collective: str = "allreduce") -> Meaning:
    """Protocols NCCL may use for ``collective`` under ``env`` (LL128 only where the platform allows)."""
    return _nccl_set(env, "NCCL_PROTO", NCCL_PROTOCOLS, _collective(collective))


def cublas_workspace(raw: str | None) -> Meaning:
    """``deterministic`` for ``:4096:8`` / ``:16:8``; ``fixed_custom`` for another well-formed
    config (torch's deterministic check rejects it); ``invalid``; ``not_guaranteed`` when unset."""
    if raw is None:
        return Meaning("cublas", "not_guaranteed", "unset: cuBLAS may pick its workspace per stream")
    if raw in DETERMINISTIC_CUBLAS:
        return Meaning("cublas", "deterministic")
    if _CUBLAS_RE.match(raw):
        return Meaning("cublas", "fixed_custom", "torch.use_deterministic_algorithms accepts only :4096:8 or :16:8")
    return Meaning("cublas", "invalid", "not of the form :SIZE:COUNT")


def collective_for(*tp_sizes: Any) -> str | None:
    """The collective that reduces the compared tensor: ``allreduce`` when a side splits its
    layers over more than one tensor-parallel rank, else ``None`` (no collective reduces it)."""
    return "allreduce" if any(isinstance(tp, int) and not isinstance(tp, bool) and tp > 1 for tp in tp_sizes) else None


def _collective(name: str) -> str:
    key = name.lower().replace("_", "")
    if key not in NCCL_COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; use one of {', '.join(NCCL_COLLECTIVES)}")
    return key


# --- the comparison --------------------------------------------------------------------------------


class DetStatus(str, enum.Enum):
    MATCH = "match"  # same raw value (or both unset)
    EQUIVALENT = "equivalent"  # different raw values, same meaning
    MISMATCH = "mismatch"  # a blocking variable whose meaning differs
    DIFFERENT = "different"  # a recorded value that differs
    NOT_PROBED = "not_probed"  # a torch flag one side could not read


@dataclass(frozen=True)
class DeterminismEntry:
    """One variable or flag on both sides, with the meaning each side's value has."""

    name: str
    blocking_tier: bool
    training: Any
    rollout: Any
    status: DetStatus
    training_meaning: Meaning | None = None
    rollout_meaning: Meaning | None = None
    note: str = ""
    kind: str = "env"  # env: an environment variable (None = unset); torch: a torch flag

    @property
    def blocking(self) -> bool:
        return self.status is DetStatus.MISMATCH

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "tier": "blocking" if self.blocking_tier else "recorded",
            "status": self.status.value,
            "training": self.training,
            "rollout": self.rollout,
            "training_meaning": self.training_meaning.to_dict() if self.training_meaning else None,
            "rollout_meaning": self.rollout_meaning.to_dict() if self.rollout_meaning else None,
            "note": self.note,
        }


def describe_env_value(raw: str | None) -> str:
    """``unset`` or ``set to 'VALUE'``: how a finding names one side's value."""
    return "unset" if raw is None else f"set to {raw!r}"


def _env_entry(name, t_env, r_env, collective) -> DeterminismEntry:
    t_raw, r_raw = t_env.get(name), r_env.get(name)
    meaning_of = {
        "NCCL_ALGO": lambda env: nccl_algorithms(env, collective),
        "NCCL_PROTO": lambda env: nccl_protocols(env, collective),
        "CUBLAS_WORKSPACE_CONFIG": lambda env: cublas_workspace(env.get(name)),
    }.get(name)
    if name.startswith("NCCL_") and name in BLOCKING_VARIABLES and collective is None:
        meaning_of = None  # no collective reduces the compared tensor: recorded only
    if meaning_of is None:
        if t_raw == r_raw:
            return DeterminismEntry(name, False, t_raw, r_raw, DetStatus.MATCH)
        note = "recorded; no collective reduces the compared tensor" if name in BLOCKING_VARIABLES else ""
        return DeterminismEntry(name, False, t_raw, r_raw, DetStatus.DIFFERENT, note=note)
    t_mean, r_mean = meaning_of(t_env), meaning_of(r_env)
    if t_raw == r_raw:
        status, note = DetStatus.MATCH, ""
    elif t_mean.same(r_mean) and t_mean.kind != "invalid":
        status = DetStatus.EQUIVALENT
        note = f"same meaning; training {describe_env_value(t_raw)}, rollout {describe_env_value(r_raw)}"
    else:
        status, note = DetStatus.MISMATCH, f"training {t_mean.value!r} vs rollout {r_mean.value!r}"
    return DeterminismEntry(name, True, t_raw, r_raw, status, t_mean, r_mean, note)


@dataclass(frozen=True)
class DeterminismDiff:
    """Every watched variable and flag on both sides; ``blocking`` when a blocking one differs in meaning."""

    entries: tuple[DeterminismEntry, ...]
    collective: str | None
    training_torch_status: str
    rollout_torch_status: str

    @property
    def blocking(self) -> bool:
        return any(entry.blocking for entry in self.entries)

    def entry(self, name: str) -> DeterminismEntry:
        return next(e for e in self.entries if e.name == name)

    def findings(self) -> list[Finding]:
        out = []
        for e in self.entries:
            values = f"training={e.training!r}, rollout={e.rollout!r}"
            if e.status is DetStatus.MISMATCH:
                out.append(
                    finding(
                        Code.DET_BLOCKING_MISMATCH,
                        f"determinism.{e.name}",
                        values,
                        f"{e.name} means different things on the two sides ({e.note})",
                        f"give {e.name} one meaning on both sides (policy.megatron_cfg.env_vars and "
                        "policy.generation.vllm_cfg.env_vars; vLLM's batch-invariant mode overrides it in its worker)",
                    )
                )
            elif e.status in (DetStatus.DIFFERENT, DetStatus.EQUIVALENT):
                code = Code.DET_RECORDED_DIFFERENCE if e.status is DetStatus.DIFFERENT else Code.DET_EQUIVALENT
                out.append(
                    finding(
                        code,
                        f"determinism.{e.name}",
                        values,
                        f"{e.name}: {e.note or 'differs (recorded)'}",
                        "none needed: recorded",
                    )
                )
        for side, status in (("training", self.training_torch_status), ("rollout", self.rollout_torch_status)):
            if status != "probed":
                out.append(
                    finding(
                        Code.DET_NOT_PROBED,
                        f"determinism.{side}.torch",
                        status,
                        f"torch flags of the {side} side were not read ({status})",
                        "probe inside the worker after its engine started",
                    )
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "blocking": self.blocking,
            "training_torch_status": self.training_torch_status,
            "rollout_torch_status": self.rollout_torch_status,
            "entries": [e.to_dict() for e in self.entries],
        }


def compare(
    training: DeterminismProbe, rollout: DeterminismProbe, collective: str | None = "allreduce"
) -> DeterminismDiff:
    """Compare two probes. ``collective`` is the NCCL collective that reduces the compared tensor
    (``allreduce`` for TP reductions, ``reducescatter`` with sequence parallelism); ``None`` when no
    collective reduces it (TP=1 on both sides): NCCL_ALGO/NCCL_PROTO are then only recorded."""
    coll = None if collective is None else _collective(collective)
    names = sorted((set(training.env) | set(rollout.env)) - set(BLOCKING_VARIABLES))
    entries = [_env_entry(name, training.env, rollout.env, coll) for name in BLOCKING_VARIABLES + tuple(names)]
    if training.torch is not None and rollout.torch is not None:
        for name in sorted(set(training.torch) | set(rollout.torch)):
            t, r = training.torch.get(name), rollout.torch.get(name)
            entries.append(
                DeterminismEntry(name, False, t, r, DetStatus.MATCH if t == r else DetStatus.DIFFERENT, kind="torch")
            )
    else:
        known = training.torch if training.torch is not None else rollout.torch
        for name in sorted(known or {}):
            t = (training.torch or {}).get(name)
            r = (rollout.torch or {}).get(name)
            entries.append(DeterminismEntry(name, False, t, r, DetStatus.NOT_PROBED, kind="torch"))
    return DeterminismDiff(tuple(entries), coll, training.torch_status, rollout.torch_status)
