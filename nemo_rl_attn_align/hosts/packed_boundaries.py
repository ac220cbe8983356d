"""Packed boundaries: did each attention call of the first packed micro-batch receive one boundary
per sequence NeMo-RL packed? (issue #38; upstream NeMo-RL #2105 / #4167, Megatron-Bridge #4400)

Seams (NVIDIA-NeMo/RL 7ea279a, v0.7.0, v0.6.0: ``nemo_rl.models.megatron.data``; v0.5.0:
``nemo_rl.models.megatron.common``), declared in ``seams.HOOKS["packed_boundaries"]``:
``_pack_sequences_for_megatron(input_ids, seq_lengths, ...)`` packs one micro-batch's
``len(seq_lengths)`` sequences into one ``[1, T]`` row and returns, beside it, the
``PackedSeqParams`` (``qkv_format="thd"``, ``cu_seqlens_*``) its model forward must be given
(7ea279a ``nemo_rl/models/megatron/train.py`` ``model_forward``: ``packed_seq_params=``), which
megatron-core hands to every layer's core attention. ``_prepare_vlm_batch_for_megatron`` (7ea279a,
v0.7.0: models that pack inside their forward) takes the same two arguments.

``watch(model, record)`` (the Megatron worker, once its model is built; only where
``policy.sequence_packing.enabled``): at the first packing call of the process it keeps the number
of sequences and the boundaries NeMo-RL built, and puts a one-shot forward pre-hook on every core
attention module (megatron-core's ``core_attention`` of each attention layer) and a one-shot forward
hook on every model chunk. When each chunk has run its first forward after that, the worker's
record gets the statement (``packed_by``: the packing function; ``sequences_packed``; ``built``:
the boundaries NeMo-RL built; ``calls``: each call's ``site``, ``received`` boundaries and
``sequences_attended``; ``not_called``: core attentions that ran no call) and, where a call attended
fewer sequences apart than were packed (no boundaries at all, another ``qkv_format``, a truncated
``cu_seqlens``), one ``PACKED_BOUNDARIES_DROPPED`` error naming the call and the counts; the record
is written at once. Every hook is then removed, and the first packing call has removed the seams (in
a process with no watch too): nothing of this module runs on any later call. Where packing is on but
no packing function could be wrapped (a NeMo-RL whose seams differ), the record says so when the
model is built.

"Boundaries" of a ``cu_seqlens`` tensor are the sequences it delimits: its length less one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.hosts.seams import HOOKS, Seam
from nemo_rl_attn_align.preflight.facts import sequence_packing_enabled
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.codes import Code
from nemo_rl_attn_align.vocab.errors import finding

#: The ``PackedSeqParams`` fields a core attention call's boundaries are read from.
CU_SEQLENS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
#: The attribute megatron-core's attention layers hold their kernel call in (``SelfAttention``,
#: ``CrossAttention``, ``MLASelfAttention``: ``self.core_attention``).
CORE_ATTENTION = "core_attention"
#: The seam wrapped first in the declarations: the one a note names.
PACKING_SEAM = HOOKS["packed_boundaries"].seams[0]

_seams = hooks.Hook("packed_boundaries")
#: Wrap the packing seams now or when NeMo-RL's modules are imported (idempotent); restore them.
attach, detach = _seams.attach, _seams.detach

#: The watch waiting for this process's first packed micro-batch (None: none waits).
pending: _Watch | None = None


def boundaries(params: Any) -> dict[str, Any] | None:
    """What a ``PackedSeqParams`` (or None) carries: its ``qkv_format`` and, per ``CU_SEQLENS``
    field, the sequences it delimits (None where the field is None)."""
    if params is None:
        return None
    out: dict[str, Any] = {"qkv_format": getattr(params, "qkv_format", None)}
    for name in CU_SEQLENS:
        value = getattr(params, name, None)
        out[name] = None if value is None else max(_length(value) - 1, 0)
    return out


def _length(value: Any) -> int:
    numel = getattr(value, "numel", None)
    return int(numel()) if callable(numel) else len(value)


def sequences_attended(received: Mapping[str, Any] | None, rows: int) -> int:
    """How many sequences a core attention call attends apart: by its ``thd`` boundaries (the
    fewest any given ``cu_seqlens`` delimits; a missing ``cu_seqlens_q`` / ``_kv`` delimits none),
    else one per row of its ``[s, b, ...]`` input (``rows``): a packed ``[1, T]`` row is one."""
    if received is None or received.get("qkv_format") != "thd":
        return rows
    counts = [received[name] or 0 for name in CU_SEQLENS[:2]]
    counts += [received[name] for name in CU_SEQLENS[2:] if received[name] is not None]
    return min(counts)


def watch(model: Any, record: Any) -> None:
    """State the first packed micro-batch's attention calls into ``record`` (the Megatron worker's
    ``TrainingRecord``: ``policy_cfg``, ``worker_id``, ``packed_boundaries``, ``note``, ``report``,
    ``write``, ``stop_if_strict``); nothing where its policy does not pack sequences, a note where no
    packing function could be wrapped. ``model`` is a torch module or a list of model chunks."""
    global pending
    if not sequence_packing_enabled(record.policy_cfg):
        return
    pending = _Watch(list(model) if isinstance(model, (list, tuple)) else [model], record)
    attach()
    if not _seams.wrapping:
        pending = None
        record.note(
            "policy.sequence_packing.enabled is true, but no packing function the plugin knows was found "
            f"to wrap (e.g. {PACKING_SEAM.module}.{PACKING_SEAM.path}): the sequence boundaries each "
            "attention call receives are not checked"
        )


def _wrap_pack(original: Callable, seam: Seam) -> Callable:
    def packing(input_ids, seq_lengths, *args, **kwargs):
        result = original(input_ids, seq_lengths, *args, **kwargs)
        watching = pending
        _patching.guarded(
            "watching the first packed micro-batch",
            lambda: _first_packing(watching, f"{seam.module}.{seam.path}", len(seq_lengths), result),
            watching is not None and watching.strict,
        )
        return result

    return packing


def _first_packing(watching: _Watch | None, packed_by: str, sequences: int, result: Any) -> None:
    """The process's first packing call: the seams go (nothing of this module runs on a later one,
    in a process with no watch too); the waiting watch, if any, takes the call."""
    detach()
    if watching is not None:
        watching.packed(packed_by, sequences, result)


def _site(chunk_index: int, name: str, chunks: int) -> str:
    """A core attention's path in its chunk, without the wrappers' ``module.`` (``model[i].`` when
    there are several chunks)."""
    while name.startswith("module."):
        name = name[len("module.") :]
    return f"model[{chunk_index}].{name}" if chunks > 1 else name


class _Watch:
    """One worker's first packed micro-batch, from its packing call to the end of its forward."""

    def __init__(self, chunks: list[Any], record: Any):
        self.chunks, self.record = chunks, record
        self.strict = bool(record.settings().strict)
        self.statement: dict[str, Any] | None = None
        self.calls: dict[str, dict[str, Any]] = {}
        self.handles: list[Any] = []
        self.waiting: set[int] = set()

    def packed(self, packed_by: str, sequences: int, result: Any) -> None:
        """The first packing call returned: keep what it packed and built, hook the next forward."""
        global pending
        pending = None
        built = next((item for item in _items(result) if hasattr(item, "cu_seqlens_q")), None)
        sites: list[str] = []
        try:
            for index, chunk in enumerate(self.chunks):
                for name, module in chunk.named_modules():
                    if name.rsplit(".", 1)[-1] == CORE_ATTENTION:
                        sites.append(_site(index, name, len(self.chunks)))
                        hook = self._on_call(sites[-1])
                        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
                self.waiting.add(index)
                self.handles.append(_after_forward(chunk, self._chunk_done(index)))
        except BaseException:
            self._remove_hooks()
            raise
        self.statement = {
            "packed_by": packed_by,
            "sequences_packed": sequences,
            "built": boundaries(built),
            "calls": [],
            "not_called": sites,
        }

    def _remove_hooks(self) -> None:
        while self.handles:
            self.handles.pop().remove()

    def _on_call(self, site: str) -> Callable:
        def before(module: Any, args: tuple, kwargs: dict) -> None:
            if site not in self.calls:
                _patching.guarded(
                    "reading an attention call's packed boundaries",
                    lambda: self._read_call(site, module, args, kwargs),
                    self.strict,
                )

        return before

    def _read_call(self, site: str, module: Any, args: tuple, kwargs: dict) -> None:
        query: Any = args[0] if args else kwargs.get("query")
        rows = int(query.shape[1]) if getattr(query, "dim", lambda: 0)() == 4 else 1
        received = boundaries(_packed_argument(module, args, kwargs))
        self.calls[site] = {
            "site": site,
            "received": received,
            "sequences_attended": sequences_attended(received, rows),
        }

    def _chunk_done(self, index: int) -> Callable:
        def done(*_: Any) -> None:
            if index in self.waiting:
                self.waiting.discard(index)
                if not self.waiting:
                    _patching.guarded("stating the packed boundaries", self._state, self.strict)

        return done

    def _state(self) -> None:
        """Every chunk ran its forward: remove every hook, record the statement and any finding."""
        self._remove_hooks()
        statement = self.statement
        if statement is None:
            return
        statement["calls"] = list(self.calls.values())
        statement["not_called"] = [site for site in statement["not_called"] if site not in self.calls]
        self.record.packed_boundaries = statement
        if not self.calls:
            self.record.note(
                f"the first packed micro-batch ({statement['sequences_packed']} sequences) called no "
                f"{CORE_ATTENTION} module of the model: the sequence boundaries were not checked"
            )
        dropped = dropped_finding(self.record.worker_id, statement)
        if dropped is not None:
            self.record.report(dropped)
        self.record.write(self.record.stage)  # the stage it reached: this is part of that forward
        self.record.stop_if_strict()


def dropped_finding(worker_id: str, statement: Mapping[str, Any]) -> Any:
    """``PACKED_BOUNDARIES_DROPPED`` where a call of ``statement`` attended fewer sequences apart
    than were packed, naming the first such call and the counts; None where every call got them."""
    expected = statement["sequences_packed"]
    short = [call for call in statement["calls"] if call["sequences_attended"] < expected]
    if not short:
        return None
    first = short[0]
    received = first["received"]
    if received is None:
        got = "no packed_seq_params"
    elif received["qkv_format"] != "thd":
        got = f"packed_seq_params with qkv_format={received['qkv_format']!r}, not 'thd',"
    else:
        got = "packed_seq_params whose " + ", ".join(f"{n} delimits {received[n]}" for n in CU_SEQLENS)
    built = statement["built"]
    made = f"; NeMo-RL built PackedSeqParams whose cu_seqlens_q delimits {built['cu_seqlens_q']}" if built else ""
    return finding(
        Code.PACKED_BOUNDARIES_DROPPED,
        f"workers.{worker_id}.{first['site']}",
        f"{first['sequences_attended']} of {expected} sequences",
        f"training worker {worker_id}: the first packed micro-batch packed {expected} sequences "
        f"({statement['packed_by']}{made}), but {first['site']} received {got} and attended them as "
        f"{first['sequences_attended']} ({len(short)} of the {len(statement['calls'])} attention calls attended "
        f"fewer than {expected}): tokens attend across sequence boundaries",
        "every attention call of a packed micro-batch must receive the PackedSeqParams NeMo-RL built for it, "
        "one boundary per sequence (NeMo-RL's model_forward passes them as packed_seq_params=; a host between "
        "the packing and the kernel that drops or truncates them is NeMo-RL #2105 / #4167, Megatron-Bridge "
        "#4400); until the host is fixed, policy.sequence_packing.enabled=false trains unpacked",
    )


def _items(result: Any) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _packed_argument(module: Any, args: tuple, kwargs: dict) -> Any:
    """The ``packed_seq_params`` a core attention call was given (None: none), by its forward's signature."""
    if "packed_seq_params" in kwargs:
        return kwargs["packed_seq_params"]
    try:
        return inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments.get("packed_seq_params")
    except (TypeError, ValueError):
        return None


def _after_forward(module: Any, hook: Callable) -> Any:
    """A forward hook on ``module`` that also runs when its forward raises (torch >= 2.1)."""
    try:
        return module.register_forward_hook(hook, always_call=True)
    except TypeError:  # torch before 2.1 has no always_call
        return module.register_forward_hook(hook)
