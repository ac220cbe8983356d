"""The worker-file store: the files each worker writes for the run report, and reading them back.

Each worker writes its own files, atomically (a temp file in the same directory, then
``os.replace``), so many processes can write at once and a reader never sees half a file:

* ``<report_dir>/workers/<side>--<worker_id>.json`` (``write_worker_record``): its contract and
  determinism probe;
* ``<report_dir>/hosts/<side>--<worker_id>.json`` (``write_worker_detail``): what its host hook saw
  (the stage it reached, findings such as a read-back mismatch, its peers);
* ``<report_dir>/claims/<side>--<worker_id>.json`` (``claim_worker_id``): which engine of which run
  holds that id, so that a second engine recording under the same id takes the next one instead of
  replacing the first's files (the readers never look here).

``read_worker_files`` reads them all into a ``worker_files.WorkerFiles``: a corrupt or foreign
file is listed as unreadable, a temp file left behind as an incomplete write, a file another run
wrote as stale; none of them stops the reading. Stdlib only (the worker path imports this module).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Union

from nemo_rl_attn_align.binding.determinism_probe import DeterminismProbe
from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.report.record_templates import Parsed, RecordReader
from nemo_rl_attn_align.report.worker_files import HostDetail, UnreadableFile, WorkerFiles, WorkerRecord
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_RECORD_BYTES

REPORT_SCHEMA_VERSION = 1
WORKER_KIND = "nemo-rl-attn-align/worker"
DETAIL_KIND = "nemo-rl-attn-align/host-detail"
CLAIM_KIND = "nemo-rl-attn-align/worker-claim"
WORKERS_DIR = "workers"
HOSTS_DIR = "hosts"
CLAIMS_DIR = "claims"

PathLike = Union[str, "os.PathLike[str]"]


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second (the ``written_at`` / ``created_at`` stamps)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def resolved(path: PathLike) -> Path:
    """``path`` as the file system names it once its folders exist. A path that steps back with
    ``..`` is resolved first (symlinks followed, then ``..`` applied), so creating its folders never
    creates one outside it: ``X/rd/../rd2/workers`` would otherwise leave an empty ``X/rd`` behind."""
    path = Path(path)
    return Path(os.path.realpath(path)) if ".." in path.parts else path


def atomic_write_json(path: PathLike, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` atomically: a temp file in the same directory, fsync,
    ``os.replace``. Readers see the old file or the new one, never a part. The folders it creates
    are ``resolved(path)``'s."""
    path = resolved(path)
    tmp = _synced_temp_copy(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _synced_temp_copy(path: Path, data: Any) -> str:
    """``data`` as strict JSON (``jsonio``), written and fsynced to a temp file beside ``path``: its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            jsonio.write(handle, data)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


#: Longest worker file name: the temp name adds ``.`` + ``.XXXXXXXX.tmp`` and must stay within
#: the 255 bytes most file systems allow.
_MAX_FILE_NAME = 200


#: A temp file untouched this long belongs to a writer that died (a live write takes milliseconds).
STALE_TEMP_AGE_S = 10.0


def remove_stale_temp_files(report_dir: PathLike, older_than_s: float = STALE_TEMP_AGE_S) -> list[str]:
    """Delete the temp files (``.*.tmp``) that writers killed mid-write left in ``report_dir``,
    ``workers/`` and ``hosts/``, when untouched for ``older_than_s``; returns their paths. Never raises."""
    removed, cutoff = [], time.time() - older_than_s
    for folder in (Path(report_dir), *(Path(report_dir) / name for name in (WORKERS_DIR, HOSTS_DIR, CLAIMS_DIR))):
        try:
            candidates = sorted(folder.glob(".*.tmp")) if folder.is_dir() else []
        except OSError:
            continue
        for path in candidates:
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed.append(str(path))
            except OSError:
                continue
    return removed


def safe_name(text: str) -> str:
    """``text`` as part of a file name: every character but letters, digits, ``.``, ``_`` and ``-``
    replaced by ``_``, so no ``/`` (nor NUL) in an id can name another folder."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def _worker_file(report_dir: PathLike, folder: str, side: str, worker_id: str) -> Path:
    """``<report_dir>/<folder>/<side>--<worker_id>.json`` with ``safe_name``'s side and id."""
    side, safe = safe_name(side), safe_name(worker_id)
    name = f"{side}--{safe}.json"
    if len(name) > _MAX_FILE_NAME:  # a very long id: cut, with a digest of the whole id (the record keeps it whole)
        digest = hashlib.sha256(worker_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = f"{side[:20]}--{safe[: _MAX_FILE_NAME - min(len(side), 20) - 25]}-{digest}.json"
    return resolved(report_dir) / folder / name


def worker_record_path(report_dir: PathLike, side: str, worker_id: str) -> Path:
    """Where the record of ``worker_id`` on ``side`` lives (unsafe characters become ``_``)."""
    return _worker_file(report_dir, WORKERS_DIR, side, worker_id)


def worker_detail_path(report_dir: PathLike, side: str, worker_id: str) -> Path:
    """Where the host detail of ``worker_id`` on ``side`` lives (same name, under ``hosts/``)."""
    return _worker_file(report_dir, HOSTS_DIR, side, worker_id)


class Claim(NamedTuple):
    """What ``claim_worker_id`` found: ``held`` (the id is this writer's now) and ``replaced``: the
    claim of another process taken over although nothing tells whether it belongs to this run (the
    claimer has no run id), whose records this writer's then replace (None otherwise)."""

    held: bool
    replaced: dict[str, Any] | None = None


def _exclusive_write_json(path: Path, data: Any) -> bool:
    """Create ``path`` holding ``data`` unless it exists (False then): the whole file appears at
    once (a temp file hard-linked into place), so a reader never sees a part of it."""
    tmp = _synced_temp_copy(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: create exclusively, then fill it
            try:
                created = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(created, "w", encoding="utf-8") as handle:
                handle.write(jsonio.dumps(data, indent=2) + "\n")
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


#: A claim that cannot be read: being written (then held by whoever writes it) or left broken.
_BUSY, _BROKEN = {"unreadable": "recent"}, {"unreadable": "old"}


def _read_claim(path: Path) -> dict[str, Any] | None:
    """The claim at ``path``; None when there is none; ``_BUSY`` or ``_BROKEN`` when it is not a
    readable claim (younger or older than ``STALE_TEMP_AGE_S``)."""
    try:
        data = jsonio.read_json_file(path, MAX_RECORD_BYTES, "worker claim")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        try:
            recent = time.time() - path.stat().st_mtime < STALE_TEMP_AGE_S
        except OSError:
            return None
        return _BUSY if recent else _BROKEN
    return data if isinstance(data, dict) and data.get("kind") == CLAIM_KIND else _BROKEN


def claim_worker_id(
    report_dir: PathLike,
    side: str,
    worker_id: str,
    writer: str,
    run_id: str | None = None,
    session: str | None = None,
) -> Claim:
    """Claim ``worker_id`` on ``side`` for ``writer`` (one engine's token) before writing its files.

    Held by this writer already, or by nobody: it is ``writer``'s (``held``). Held by another
    writer of the same run (the same ``run_id``; without one, the same ``session``, the id shared
    by the processes one user process started): not held, the caller takes the next id, so no
    record of this run is ever replaced. Held by another run: taken over (its files are stale);
    ``replaced`` says whose it was when this writer has no ``run_id`` (a run the report cannot tell
    from this one, whose records are then lost: the caller warns). Two writers taking over the
    same stale claim in the same instant may both believe they hold it (a stale claim has no
    compare-and-swap); a fresh id is claimed atomically (``os.link``)."""
    path = _worker_file(report_dir, CLAIMS_DIR, side, worker_id)
    mine = {
        "kind": CLAIM_KIND,
        "side": side,
        "worker_id": worker_id,
        "writer": writer,
        "run_id": run_id,
        "session": session,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "claimed_at": now_iso(),
    }
    for _ in range(3):  # a claim that vanishes or changes hands while we look: look again
        if _exclusive_write_json(path, mine):
            return Claim(True)
        held = _read_claim(path)
        if held is None:
            continue
        if held is _BUSY:
            return Claim(False)
        if held is not _BROKEN:
            if held.get("writer") == writer:
                return Claim(True)
            if held.get("run_id") == run_id and (run_id is not None or held.get("session") == session):
                return Claim(False)
        atomic_write_json(path, mine)
        if (_read_claim(path) or {}).get("writer") == writer:
            return Claim(True, held if run_id is None and held is not _BROKEN else None)
    return Claim(False)


def write_worker_record(
    report_dir: PathLike, contract: AttentionContract, probe: DeterminismProbe | None = None, run_id: str | None = None
) -> Path:
    """Write one worker's contract and determinism probe (atomic; rewriting replaces it).
    ``run_id``: the driver's id of this run (records of other runs are then stale)."""
    record = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": WORKER_KIND,
        "side": contract.side,
        "worker_id": contract.worker_id,
        "run_id": run_id,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "written_at": now_iso(),
        "contract": contract.to_dict(),
        "determinism": probe.to_dict() if probe is not None else None,
    }
    return atomic_write_json(worker_record_path(report_dir, contract.side, contract.worker_id), record)


def write_worker_detail(
    report_dir: PathLike, side: str, worker_id: str, detail: Mapping[str, Any], run_id: str | None = None
) -> Path:
    """Write what one worker's host hook saw (atomic; rewriting replaces it). The report reads its
    ``stage`` (str), ``findings`` (list of str), ``host`` and ``peers`` (the worker ids its group
    should have); every other key is kept for humans."""
    body = {"kind": DETAIL_KIND, "side": side, "worker_id": worker_id, "run_id": run_id, **detail}
    return atomic_write_json(worker_detail_path(report_dir, side, worker_id), body)


def schema_version_ok(data: Mapping[str, Any]) -> bool:
    """Exactly the integer ``REPORT_SCHEMA_VERSION`` (``1.0`` and ``true`` equal 1 in Python, but are not it)."""
    version = data.get("schema_version")
    return type(version) is int and version == REPORT_SCHEMA_VERSION


def _parse_worker_record(data: Any) -> WorkerRecord:
    if not isinstance(data, dict) or data.get("kind") != WORKER_KIND:
        raise ValueError(f"not a worker record (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    if not schema_version_ok(data):
        raise ValueError(f"schema_version {data.get('schema_version')!r}, this version reads {REPORT_SCHEMA_VERSION}")
    contract = AttentionContract.from_dict(data["contract"])
    probe = DeterminismProbe.from_dict(data["determinism"]) if data.get("determinism") is not None else None
    run_id = data.get("run_id")
    return WorkerRecord(contract, probe, run_id if isinstance(run_id, str) else None)


def _renamed_record(record: WorkerRecord, worker_id: str, run_id: Any) -> WorkerRecord:
    """``record`` (a template's) as the worker ``worker_id`` of run ``run_id`` wrote it."""
    return WorkerRecord(record.contract.renamed(worker_id), record.probe, run_id if isinstance(run_id, str) else None)


def _parse_detail(data: Any) -> HostDetail:
    if not isinstance(data, dict) or data.get("kind") != DETAIL_KIND:
        raise ValueError(f"not a host detail (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    return HostDetail.from_dict(data)


class _Leftovers(NamedTuple):
    """What reading the folders could not use, gathered as it goes."""

    unreadable: list[UnreadableFile]
    incomplete_writes: list[str]
    stale: list[str]


def _read_detail(path: Path) -> Parsed:
    data = jsonio.read_json_file(path, MAX_RECORD_BYTES, "worker file")
    return Parsed(_parse_detail(data), data.get("run_id"))


def _read_folder(folder: Path, read: Callable[[Path], Parsed], run_id: str | None, left: _Leftovers) -> list:
    parsed = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            item, written_run_id = read(path)
        except Exception as err:
            left.unreadable.append(UnreadableFile(str(path), f"{type(err).__name__}: {str(err)[:500]}"))
            continue
        if run_id is not None and written_run_id != run_id:
            left.stale.append(str(path))
        else:
            parsed.append(item)
    left.incomplete_writes.extend(sorted(str(p) for p in folder.glob(".*.tmp")) if folder.is_dir() else [])
    return parsed


def read_worker_files(report_dir: PathLike, run_id: str | None = None) -> WorkerFiles:
    """Every worker file under ``report_dir``: the records, the host details, and the files that
    could not be used (unreadable, incomplete writes and, when ``run_id`` is given, another run's)."""
    left = _Leftovers([], [], [])
    report_dir = resolved(report_dir)
    reader = RecordReader(_parse_worker_record, _renamed_record)
    records = _read_folder(Path(report_dir) / WORKERS_DIR, reader.read, run_id, left)
    details = _read_folder(Path(report_dir) / HOSTS_DIR, _read_detail, run_id, left)
    return WorkerFiles(
        records=tuple(sorted(records, key=lambda record: record.key)),
        details={detail.key: detail for detail in details},
        unreadable=tuple(left.unreadable),
        incomplete_writes=tuple(left.incomplete_writes),
        stale=tuple(left.stale),
    )
