"""Strict JSON out and in (issue #40, item 4): ``vocab.jsonio`` writes what ``json.dumps`` writes with
non-finite numbers as null, reads refusing duplicate keys and NaN/Infinity, and is the one way the
package writes and reads JSON."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.report.document import collect, write_report
from nemo_rl_attn_align.report.store import read_worker_files, worker_record_path, write_worker_record
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_NESTING, InputRefused
from tests.contract_samples import full_contract

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
#: Modules that may call ``json`` themselves, each with its reason.
JSON_ALLOWED = {
    "vocab/jsonio.py": "the one home of strict JSON",
    "vocab/change.py": "quotes a string for a Hydra override (not a JSON document)",
    "report/report_render.py": "shows a value in a table cell (text, not a JSON document)",
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from([None, 1, 2, 4]), st.booleans())
def test_written_as_json_dumps_writes_it(value, indent, sort_keys):
    expected = json.dumps(value, indent=indent, sort_keys=sort_keys)
    assert jsonio.dumps(value, indent=indent, sort_keys=sort_keys) == expected
    assert "".join(jsonio.iterencode(value, indent=indent or 2)) == json.dumps(value, indent=indent or 2)


@settings(max_examples=200, deadline=None)
@given(values, values)
def test_a_container_held_twice_is_written_the_same_both_times(shared, other):
    value = {"a": [shared, {"b": shared}], "c": other, "d": [[shared]]}
    assert jsonio.dumps(value, indent=2) == json.dumps(value, indent=2)


def test_non_finite_numbers_are_written_as_null_and_cycles_refused():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": math.nan}}
    for indent in (None, 2):
        assert json.loads(jsonio.dumps(value, indent=indent)) == {"a": None, "b": [None, None, 1.5], "c": {"d": None}}
    cyclic: list = []
    cyclic.append(cyclic)
    for indent in (None, 2):
        with pytest.raises(ValueError, match="Circular"):
            jsonio.dumps(cyclic, indent=indent)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"verdict": "fail", "verdict": "pass"}', "the key 'verdict' appears twice"),
        ('{"a": {"b": 1, "b": 1}}', "the key 'b' appears twice"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ("[Infinity]", "Infinity is not a JSON number"),
        ("[-Infinity]", "-Infinity is not a JSON number"),
        ("[1e999]", "'1e999' is too large for a float"),
        ("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1), f"nests deeper than {MAX_NESTING} levels"),
        ("[" * 100_000 + "]" * 100_000, f"nests deeper than {MAX_NESTING} levels"),
    ],
)
def test_reading_refuses_what_strict_json_does_not_have(text, said):
    with pytest.raises(InputRefused) as caught:
        jsonio.loads(text, "report r.json")
    assert str(caught.value).startswith("report r.json")
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_package_writes_and_reads_json_only_through_jsonio():
    """Every ``json.dump(s)`` / ``json.load(s)`` call of the package is in ``JSON_ALLOWED``'s modules."""
    calls = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "json"
                and node.attr in ("dump", "dumps", "load", "loads")
            ):
                calls.setdefault(module, []).append(f"json.{node.attr}:{node.lineno}")
    assert set(calls) <= set(JSON_ALLOWED), {m: c for m, c in calls.items() if m not in JSON_ALLOWED}


def _report(tmp_path: Path) -> Path:
    write_worker_record(tmp_path, full_contract("training", "policy-rank0"), probe({}, torch_module=False))
    write_worker_record(tmp_path, full_contract("rollout", "vllm-rank0-worker0"), probe({}, torch_module=False))
    return write_report(tmp_path, collect(tmp_path, AlignSettings()))


def test_report_json_over_a_report_holding_nan_is_one_line_and_exit_2(tmp_path, capsys):
    path = _report(tmp_path)
    path.write_text(path.read_text().replace('"history": []', '"history": [NaN]'))
    assert main(["report", "--json", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "NaN is not a JSON number" in err and str(path) in err


def test_a_report_with_the_verdict_twice_is_refused_not_read_as_the_last(tmp_path, capsys):
    path = _report(tmp_path)
    text = path.read_text()
    assert '"verdict": "pass"' in text
    path.write_text(text.replace('"verdict": "pass"', '"verdict": "fail",\n  "verdict": "pass"'))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the key 'verdict' appears twice" in err and str(path) in err


def test_a_worker_record_with_a_duplicate_key_is_unreadable_and_named(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "policy-rank0"))
    record = worker_record_path(tmp_path, "training", "policy-rank0")
    record.write_text(record.read_text().replace('"side": "training",', '"side": "training",\n  "side": "rollout",', 1))
    files = read_worker_files(tmp_path)
    assert files.records == ()
    assert len(files.unreadable) == 1 and "the key 'side' appears twice" in files.unreadable[0].error
