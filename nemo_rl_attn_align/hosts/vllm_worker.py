"""vLLM generation worker hook: record what attention vLLM really runs, once its engine is up.

Two doors reach it in every vLLM process (the NeMo-RL generation actor, vLLM's engine core and,
with TP*PP > 1, vLLM's own Ray workers):

* the ``vllm.general_plugins`` entry point ``nemo_rl_attn_align = ...:register``, which vLLM's
  ``load_general_plugins()`` calls with no arguments once per process, wherever this package is
  installed in the worker's environment;
* the bootstrap's import hook (``.pth`` or the ``PYTHONPATH`` shim) for NeMo-RL's vLLM venv, which
  does not contain this package and so has no entry point for vLLM to find.

Both call ``attach()``, which wraps ``compile_or_warm_up_model`` on the worker class vLLM really
instantiates: it runs after the model is loaded and the KV cache is allocated, so the attention
layers in ``vllm_config.compilation_config.static_forward_context`` carry the backend vLLM chose
and ``VLLM_BATCH_INVARIANT``'s rewrites of the environment have happened. The base
``vllm.v1.worker.gpu_worker.Worker`` is wrapped when its module is imported; its subclasses
(``CPUWorker`` and ``XPUWorker`` override the method without calling ``super()``, a platform
plugin may bring its own) are covered when they are instantiated: ``Worker.__init__`` is wrapped
too, and wraps the method on the class of ``self`` that defines it. A subclass calling ``super()``
records once. A class whose method cannot be wrapped is one warning naming it (an error in strict
mode). The vLLM version is checked against ``host_versions.SUPPORTED`` once, at the first patch.

One record per engine: each worker an engine warms up gets a token of its own, and claims its id
(``report.store.claim_worker_id``) before its first write. A second engine recording under the same
id in the same run (another ``LLM(...)`` in the same process, an engine-core process started after
the first, an actor restarted with the same ``RANK``) takes ``<id>-engine1``, then ``-engine2``, ...;
no engine's files replace another's. Without a driver run id, "the same run" is the processes that
share ``NEMO_RL_ATTN_ALIGN_SESSION`` (set by the first process that loads the hook, inherited by
the processes it starts); a claim of another session is taken over with a warning naming what it
replaces, since nothing tells whether it was this run's.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.hosts import bootstrap, hooks
from nemo_rl_attn_align.hosts.seams import HOOKS, Seam
from nemo_rl_attn_align.hosts.worker_records import HostRecord, guarded_step, log, world_size
from nemo_rl_attn_align.vocab import host_versions as versions
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.worker_ids import engine_worker_id, rollout_peers, rollout_worker_id

if TYPE_CHECKING:
    from nemo_rl_attn_align.contract.contract import FieldValue
    from nemo_rl_attn_align.contract.vllm_snapshot import VllmSnapshot

#: The base worker's method run once the engine is up (wrapped on every class defining it).
WARM_UP = HOOKS["vllm_worker"].seams[0]
#: Shared by a user process and the processes it starts: "one run" where no driver gave a run id.
SESSION_ENV = "NEMO_RL_ATTN_ALIGN_SESSION"
#: Engines recorded under one worker id in one run at most (``-engine1`` ... ``-engine{N-1}``).
MAX_ENGINES = 100


def session() -> str:
    """This process tree's session (set here, once, when no parent process set it)."""
    return os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)


def rollout_versions() -> dict[str, str]:
    """Versions of vLLM and the libraries that decide its attention; those not installed are left out."""
    from nemo_rl_attn_align.contract.rollout import VERSIONED

    vllm = versions.installed_version("vLLM")
    return {**({"vllm": vllm} if vllm else {}), **versions.library_versions(VERSIONED)}


class RolloutRecord(HostRecord):
    """What one vLLM worker process saw, for one engine (``writer``: that engine's worker's token)."""

    host = "vllm_worker"

    def __init__(self, worker_id: str, snapshot: VllmSnapshot, writer: str | None = None):
        super().__init__()
        self.base_id = self.worker_id = worker_id
        self.snapshot = snapshot
        self.writer = writer or uuid.uuid4().hex
        self.engine: int | None = None  # the k of ``-engine<k>`` once the id is claimed
        #: ``rope``, ``mask``, ``softmax`` as the engine's modules compute them (``hosts.vllm_behaviour``)
        self.behaviour: dict[str, FieldValue] = {}

    def claim(self, report_dir: str) -> bool:
        """Claim the first id of this worker no other engine of this run holds; False (one warning:
        this engine's record is lost) when every one is taken."""
        from nemo_rl_attn_align.report.store import claim_worker_id

        run_id = self.settings().run_id
        for engine in range(MAX_ENGINES):
            candidate = engine_worker_id(self.base_id, engine)
            claim = claim_worker_id(report_dir, "rollout", candidate, self.writer, run_id, session())
            if not claim.held:
                continue
            self.worker_id, self.engine = candidate, engine
            if claim.replaced is not None:
                log.warning(
                    "nemo-rl-attn-align: the rollout record %s written by pid %s on %s at %s is replaced by this "
                    "engine's: no run id tells whether it was this run's (the driver sets one; a script "
                    "without it: give each run its own NEMO_RL_ATTN_ALIGN_REPORT_DIR)",
                    candidate,
                    claim.replaced.get("pid"),
                    claim.replaced.get("host"),
                    claim.replaced.get("claimed_at"),
                )
            elif engine:
                log.info(
                    "nemo-rl-attn-align: another vLLM engine of this run holds %s; recording as %s",
                    self.base_id,
                    candidate,
                )
            return True
        lost = (
            f"this vLLM engine's record is lost: {self.base_id} and its {MAX_ENGINES - 1} -engine<k> ids are all "
            f"held by other engines of this run (see {Path(report_dir) / 'claims'})"
        )
        if self.settings().strict:
            raise _patching.StrictModeError(lost + ". attention_align.strict is true, so the run stops.")
        log.warning("nemo-rl-attn-align: %s", lost)
        return False

    def write(self, stage: str) -> Path | None:
        """Claim this engine's id at its first write, then write (never over another engine's files)."""
        report_dir = self.settings().report_dir
        if report_dir and self.engine is None and not self.claim(report_dir):
            self.stage = stage
            return None
        return super().write(stage)

    def contract(self):
        from nemo_rl_attn_align.contract.rollout import rollout_contract

        return rollout_contract(self.snapshot, self.worker_id, rollout_versions(), self.behaviour)

    def detail(self) -> dict[str, Any]:
        return {"vllm_config": self.snapshot.to_dict()}

    def peers(self) -> list[str]:
        return rollout_peers(world_size(), self.snapshot.model_parallel_size(), self.engine or 0)


#: The record of the last engine that warmed up in this process (None until one has).
record: RolloutRecord | None = None
#: Every engine recorded in this process, in order.
records: list[RolloutRecord] = []
#: Worker object -> its token: an engine warmed up again rewrites its own record.
_writers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _writer_of(worker: Any) -> str:
    try:
        return _writers.setdefault(worker, uuid.uuid4().hex)
    except TypeError:  # not weakly referenceable: a token of its own each time
        return uuid.uuid4().hex


def _model_modules(worker: Any) -> dict[str, Any] | None:
    """The worker's model modules by name (``worker.model_runner.model``), or None where it shows none."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    named = getattr(model, "named_modules", None)
    if not callable(named):
        return None
    try:
        return dict(named())
    except Exception:  # a model that cannot list its modules: the gate stays unobservable
        return None


def record_engine(worker: Any) -> RolloutRecord:
    """Read one warmed-up vLLM worker and write its record."""
    global record
    from nemo_rl_attn_align.binding.determinism import probe
    from nemo_rl_attn_align.contract.vllm_snapshot import read_vllm_snapshot

    vllm_config = worker.vllm_config
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    modules = _model_modules(worker)
    snapshot = read_vllm_snapshot(vllm_config, context, os.environ, modules)
    worker_id = rollout_worker_id(os.environ.get("RANK", "0"), getattr(worker, "rank", 0))
    record = RolloutRecord(worker_id, snapshot, _writer_of(worker))
    records.append(record)
    record.probe = probe()
    record.behaviour = _behaviour(record, context, modules)
    requested, chosen = snapshot.requested_backend, snapshot.chosen_backends()
    if requested and chosen and chosen != [requested]:
        record.note(
            f"vLLM was asked for attention backend {requested} ({snapshot.requested_source}) "
            f"but chose {', '.join(chosen)}"
        )
    record.write("engine_ready")
    record.stop_if_strict()
    return record


def _behaviour(record: RolloutRecord, context: Any, modules: dict[str, Any] | None) -> dict[str, FieldValue]:
    """The engine's ``rope``, ``mask`` and ``softmax`` (``hosts.vllm_behaviour``); where the reader
    itself fails (torch missing, ...), a note and the three fields unobservable with the reason."""
    from nemo_rl_attn_align.contract.contract import FieldValue
    from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS

    try:
        from nemo_rl_attn_align.hosts.vllm_behaviour import read_behaviour

        fields, problems = read_behaviour(context, modules)
        for problem in problems:
            record.note(problem)
        return fields
    except Exception as err:  # the engine runs on; its record says why these fields are missing
        problem = f"the attention behaviour (rope, mask, softmax) was not read: {type(err).__name__}: {err}"
        record.note(problem)
        return {name: FieldValue.unobservable(None, problem) for name in BEHAVIOUR_FIELDS}


_warming = threading.local()


def _wrap_warm_up(original: Callable, seam: Seam) -> Callable:
    def compile_or_warm_up_model(self, *args, **kwargs):
        # A subclass override calling super() runs two wrappers: only the outermost records.
        depth = getattr(_warming, "depth", 0)
        _warming.depth = depth + 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            _warming.depth = depth
        if depth == 0:
            guarded_step("recording the vLLM engine", lambda: record_engine(self))
        return result

    return compile_or_warm_up_model


def cover(worker_class: type) -> bool:
    """Wrap ``compile_or_warm_up_model`` on the class in ``worker_class``'s MRO that defines it;
    False (one warning naming the class, an error in strict mode) when it cannot be wrapped."""
    method = WARM_UP.path.rsplit(".", 1)[1]
    definer = next((klass for klass in worker_class.__mro__ if method in vars(klass)), None)
    function = vars(definer).get(method) if definer is not None else None
    if function is not None and _patching.is_wrapped(function):
        return True
    if not inspect.isfunction(function):
        what = "has no" if definer is None else f"defines {method} as a {type(function).__name__}, not a plain"
        hooks.unsupported(
            "vLLM",
            f"worker class {worker_class.__module__}.{worker_class.__qualname__} {what} method {method} the plugin "
            "can wrap, so its engine is not recorded",
        )
        return False
    return _seams.wrap(definer, method, functools.partial(_wrap_warm_up, seam=WARM_UP))


def _wrap_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        guarded_step(f"covering vLLM worker class {type(self).__qualname__}", lambda: cover(type(self)))

    return __init__


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    child: type
    for child in cls.__subclasses__():
        found.append(child)
        found.extend(_subclasses(child))
    return found


def _patch(module) -> None:
    """Wrap the base worker's seam, then cover its subclasses: those defined so far now, later ones
    at their ``__init__``."""
    _seams.patch(module)
    if hooks.fits(WARM_UP, module):
        worker = getattr(module, WARM_UP.path.split(".")[0])
        for worker_class in _subclasses(worker):
            cover(worker_class)
        _seams.wrap(worker, "__init__", _wrap_init)


_seams = hooks.Hook("vllm_worker", _patch)


def attach() -> None:
    """Record every vLLM engine that warms up in this process from now on (idempotent); the
    session is set first, so the engine-core processes this one starts share it."""
    session()
    _seams.attach()


#: Restore vLLM's worker and stop watching.
detach = _seams.detach


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it once per process; calling it again is harmless."""
    if bootstrap.enabled():
        attach()
