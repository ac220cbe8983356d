"""Reading thousands of worker records, each template once (stdlib only).

The workers of one run that run one contract write records that differ only in the values
``store.write_worker_record`` puts on lines of their own before the contract's fields: the
record's ``worker_id``, ``run_id``, ``pid``, ``host`` and ``written_at``, then the contract's
``worker_id``. ``RecordReader`` replaces those six values by tokens of this process (unguessable,
so no file can hold them); the text that remains is a template, parsed strictly and checked once
(``parse``: the record's own checks), and each file of that template costs a regular expression
over its head and the parse of six values. The result is the full parse's: a template whose
tokens do not land on those six keys, a value that is not a JSON scalar, or any other doubt reads
that file in full. A report of 10,000 workers is read in a fraction of a second (see
``benchmarks/report_scale.py``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_RECORD_BYTES, read_text, shown_path

#: The keys whose values differ between the workers of one contract, in the order the writer puts
#: them (the record's five, then its contract's ``worker_id``), all before the contract's fields.
PER_WORKER_KEYS = ("worker_id", "run_id", "pid", "host", "written_at", "worker_id")
_PER_WORKER_LINE = re.compile(r'^ *"(worker_id|run_id|pid|host|written_at)": (.*?)(,?)$', re.M)
_FIELDS = '"fields": '
#: Templates kept: the few contracts of one run (training, rollout, a worker that differs).
MAX_TEMPLATES = 16


class Parsed(NamedTuple):
    """One file read: what ``parse`` made of it and its ``run_id`` as written."""

    item: Any
    run_id: Any


class _Template(NamedTuple):
    """A template's parse (``item`` built with the tokens in place), or None where it is not one."""

    item: Any


class RecordReader:
    """Reads worker record files with ``parse`` (JSON value -> record, raising on a bad one) and
    ``rename`` (the template's record, the file's contract worker id and run id -> the file's record)."""

    def __init__(self, parse: Callable[[Any], Any], rename: Callable[[Any, str, Any], Any]):
        self.parse, self.rename = parse, rename
        self.token = f"attn-align-{uuid.uuid4().hex}-"
        self.templates: dict[str, _Template | None] = {}

    def read(self, path: Path) -> Parsed:
        """The record in ``path``; ``ValueError`` / ``OSError`` (one line) as the full parse raises them."""
        what = "worker file"
        text = read_text(path, MAX_RECORD_BYTES, what)
        where = f"{what} {shown_path(path)}"
        fast = self._from_template(text, where)
        if fast is not None:
            return fast
        data = jsonio.loads(text, where)
        return Parsed(self.parse(data), data.get("run_id") if isinstance(data, dict) else None)

    def _from_template(self, text: str, where: str) -> Parsed | None:
        head, fields, tail = text.partition(_FIELDS)
        values: list[str] = []
        keys: list[str] = []

        def mask(match: re.Match) -> str:
            keys.append(match.group(1))
            values.append(match.group(2))
            return f'{match.group(0)[: match.start(2) - match.start(0)]}"{self.token}{len(values) - 1}"{match.group(3)}'

        masked = _PER_WORKER_LINE.sub(mask, head)
        if not fields or tuple(keys) != PER_WORKER_KEYS:
            return None
        template = self._template(masked + fields + tail, where)
        if template is None:
            return None
        try:
            parsed = jsonio.loads(f"[{','.join(values)}]", where)
        except ValueError:
            return None
        if len(parsed) != len(PER_WORKER_KEYS) or any(isinstance(v, (dict, list)) for v in parsed):
            return None
        try:
            return Parsed(self.rename(template.item, parsed[5], parsed[1]), parsed[1])
        except ValueError:  # e.g. an empty worker id: the full parse raises it as it always does
            return None

    def _template(self, text: str, where: str) -> _Template | None:
        if text in self.templates:
            return self.templates[text]
        template = None
        try:
            data = jsonio.loads(text, where)
            if self._tokens_in_place(data):
                template = _Template(self.parse(data))
        except ValueError:  # not a record: each file of it is read in full and says why
            template = None
        if len(self.templates) >= MAX_TEMPLATES:
            self.templates.pop(next(iter(self.templates)))
        self.templates[text] = template
        return template

    def _tokens_in_place(self, data: Any) -> bool:
        """Whether the six tokens sit at the six keys, each where the writer puts it."""
        contract = data.get("contract") if isinstance(data, dict) else None
        if not isinstance(contract, dict):
            return False
        places = [data.get(key) for key in PER_WORKER_KEYS[:5]] + [contract.get("worker_id")]
        return places == [f"{self.token}{index}" for index in range(len(PER_WORKER_KEYS))]
