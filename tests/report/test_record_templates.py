"""``report.record_templates``: reading a record through its template gives what reading it in full
gives, for the records the writer writes and for any edit of them (issue #40, item 8)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.report import store
from nemo_rl_attn_align.report.record_templates import RecordReader
from nemo_rl_attn_align.report.store import worker_record_path, write_worker_record
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_RECORD_BYTES
from tests.contract_samples import full_contract

#: Values a hostile edit puts where the writer puts a worker's own value.
ODD_VALUES = ['""', "5", "null", "NaN", "1e999", "{}", "[]", '"a\\"b"', '"x", "pid": 1', "true", "-0.0", '"\\u0000"']


def full_read(path: Path):
    """What reading the file without templates gives: the record and its run id, or the error."""
    try:
        data = jsonio.read_json_file(path, MAX_RECORD_BYTES, "worker file")
        return store._parse_worker_record(data), data.get("run_id")
    except Exception as err:
        return type(err).__name__, str(err)


def template_read(reader: RecordReader, path: Path):
    try:
        return tuple(reader.read(path))
    except Exception as err:
        return type(err).__name__, str(err)


def _reader() -> RecordReader:
    return RecordReader(store._parse_worker_record, store._renamed_record)


def test_the_records_of_one_contract_share_one_template_and_read_as_in_full(tmp_path):
    changed = full_contract("rollout", "x", dtype=FieldValue.observed("fp32"))
    paths = []
    for rank in range(30):
        contract = full_contract("training", f"policy-rank{rank}") if rank % 3 else changed.renamed(f"vllm-{rank}")
        run_id = None if rank % 2 else f"run-{rank % 4}"
        write_worker_record(tmp_path, contract, probe({}, torch_module=False) if rank % 5 else None, run_id)
        paths.append(worker_record_path(tmp_path, contract.side, contract.worker_id))
    reader = _reader()
    for path in paths:
        assert template_read(reader, path) == full_read(path)
    assert len(reader.templates) == 4  # two contracts, with and without a probe
    assert all(template is not None for template in reader.templates.values())
    records = [reader.read(path).item for path in paths if "policy" in path.name]
    assert len({id(record.contract.fields) for record in records}) <= 2  # their fields are shared


def _edits(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    head = [i for i, line in enumerate(lines[:16]) if line.strip()]
    for _ in range(rng.randint(1, 3)):
        i = rng.choice(head)
        action = rng.randrange(6)
        if action == 0 and '": ' in lines[i]:
            key, _, rest = lines[i].partition('": ')
            lines[i] = f'{key}": {rng.choice(ODD_VALUES)}{"," if rest.endswith(",") else ""}'
        elif action == 1:
            lines.insert(rng.choice(head), lines[i])
        elif action == 2:
            lines.insert(
                rng.randrange(len(lines)), rng.choice(['"pid": 3,', '  "host": "h",', '    "worker_id": "w",'])
            )
        elif action == 3:
            j = rng.choice(head)
            lines[i], lines[j] = lines[j], lines[i]
        elif action == 4:
            lines[i] = lines[i].replace('": ', '":', 1)
        else:
            del lines[i]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", range(3))
def test_any_edit_of_a_record_reads_as_in_full(tmp_path, seed):
    rng = random.Random(seed)
    write_worker_record(tmp_path, full_contract("training", "policy-rank0"), probe({}, torch_module=False), "run")
    base = worker_record_path(tmp_path, "training", "policy-rank0")
    text = base.read_text()
    reader = _reader()
    assert template_read(reader, base) == full_read(base)  # the template is known from here on
    edited = tmp_path / "edited.json"
    differing = 0
    for _ in range(200):
        edited.write_text(_edits(text, rng))
        got, want = template_read(reader, edited), full_read(edited)
        assert got == want, edited.read_text()[:600]
        differing += got != full_read(base)
    assert differing > 60  # most edits change what is read
