"""The code registry (``nemo_rl_attn_align.vocab.codes``): complete, a leaf, and the docs' tables made from it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from nemo_rl_attn_align.vocab.codes import Code, Kind, Severity, codes_of, markdown_table
from nemo_rl_attn_align.vocab.errors import Finding, finding

from .conftest import REPO
from .test_import_cycles import PACKAGE, import_graph, module_files

SCRIPT = REPO / "scripts" / "update_code_tables.py"
RUN_SCRIPT = "run python scripts/update_code_tables.py"
#: How a code of the binding, determinism, report and preset kinds is spelled (rule codes read like
#: environment variables, so only their exact values are looked for).
CODE_SHAPED = re.compile(r"(ATTN|DET|REPORT|ALIGN)_[A-Z0-9]+(_[A-Z0-9]+)*")


def _script():
    spec = importlib.util.spec_from_file_location("update_code_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trees():
    return {name: ast.parse(path.read_text(), str(path)) for name, path in module_files().items()}


def test_every_code_has_one_value_a_kind_a_severity_and_a_one_line_summary():
    assert len({code.value for code in Code}) == len(Code)
    for code in Code:
        assert isinstance(code.kind, Kind) and code is Code(code.value) and code == code.value
        assert code.severity_text and (code.varies or code.severity_text == code.severity.value)
        assert code.summary and not set("|\n") & set(code.summary + code.severity_text), code
    assert {code.kind for code in Code} == set(Kind)
    assert [code for code in Code if code.varies] == [Code.REPORT_SIDE_MISSING, Code.REPORT_ROLLOUT_NOT_BOUND]
    with pytest.raises(ValueError, match="REPORT_SIDE_MISSING: the severity varies"):
        _ = Code.REPORT_SIDE_MISSING.severity


def test_values_and_names_are_the_released_ones():
    assert Code.ATTN_IDENTITY_MISMATCH.value == "ATTN_IDENTITY_MISMATCH"
    assert Code.DET_BLOCKING_MISMATCH.value == "DET_BLOCKING_MISMATCH"
    assert (
        Code.REPORT_SIDE_MISSING.value == "REPORT_SIDE_MISSING"
        and Code.ALIGN_PRESET_REFUSED.value == "ALIGN_PRESET_REFUSED"
    )
    for code in Code:
        assert code.name == code.value  # ``Code.X`` in the source is the ``X`` users see
    for code in codes_of(Kind.BINDING, Kind.DETERMINISM, Kind.REPORT):
        assert code.value.startswith({"binding": "ATTN_", "determinism": "DET_", "report": "REPORT_"}[code.kind.value])


def test_every_code_attribute_used_in_the_package_is_registered():
    used = {
        (name, node.attr)
        for name, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Code"
    }
    assert len(used) > 30  # the scan sees the users
    assert [f"{name}: Code.{attr}" for name, attr in sorted(used) if attr not in Code.__members__] == []


def test_no_code_is_written_as_a_bare_string_and_no_other_code_enum_exists():
    values = {code.value for code in Code}
    bare, enums = [], []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "Code" and name != f"{PACKAGE}.vocab.codes":
                enums.append(name)
            if (
                name != f"{PACKAGE}.vocab.codes"
                and isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and (node.value in values or CODE_SHAPED.fullmatch(node.value))
            ):
                bare.append(f"{name}:{node.lineno}: {node.value!r} (write Code.X.value)")
    assert enums == [] and bare == []


def test_the_registry_is_a_leaf():
    assert import_graph()[f"{PACKAGE}.vocab.codes"] == set()
    tree = ast.parse((REPO / PACKAGE / "vocab" / "codes.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {m for m in imported if m.startswith(PACKAGE)} == set()
    assert {m.split(".")[0] for m in imported} <= {PACKAGE, "__future__", "enum", "typing"}


def test_findings_are_made_only_by_errors_finding():
    made = [
        f"{name}:{node.lineno}"
        for name, tree in _trees().items()
        if name != f"{PACKAGE}.vocab.errors"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding"
    ]
    assert made == [], "make a Finding with errors.finding(Code.X, ...): it takes the severity from the registry"


def test_finding_takes_the_severity_from_the_code_and_round_trips():
    made = finding(Code.FLAG_NOT_BOOLEAN, "policy.x", 1, "message", "fix")
    assert made.code is Code.FLAG_NOT_BOOLEAN and made.severity is Severity.WARNING
    as_dict = made.to_dict()
    assert type(as_dict["code"]) is str and json.dumps(as_dict).startswith(
        '{"code": "FLAG_NOT_BOOLEAN", "severity": "warning"'
    )
    assert Finding.from_dict(as_dict) == made and Finding.from_dict(as_dict).code is Code.FLAG_NOT_BOOLEAN
    side = finding(Code.REPORT_SIDE_MISSING, "workers.rollout", None, "m", "f", severity=Severity.ERROR)
    assert side.severity is Severity.ERROR
    with pytest.raises(ValueError, match="REPORT_SIDE_MISSING: the severity varies"):
        finding(Code.REPORT_SIDE_MISSING, "workers.rollout", None, "m", "f")
    with pytest.raises(ValueError, match="FLAG_NOT_BOOLEAN has severity warning"):
        finding(Code.FLAG_NOT_BOOLEAN, "policy.x", 1, "m", "f", severity=Severity.ERROR)
    with pytest.raises(ValueError):
        Finding.from_dict({**as_dict, "code": "NOT_A_CODE"})


def test_markdown_table_has_one_row_per_code_of_the_kinds():
    table = markdown_table(Kind.PRESET, Kind.DETERMINISM, header="what")
    lines = table.splitlines()
    assert lines[:2] == ["| code | severity | what |", "|---|---|---|"]
    assert [re.match(r"\| `([A-Z0-9_]+)` \|", line).group(1) for line in lines[2:]] == [
        code.value for code in Code if code.kind in (Kind.DETERMINISM, Kind.PRESET)
    ]


def test_the_docs_tables_are_the_registrys():
    script = _script()
    listed = []
    for name, tables in script.FILES.items():
        text = (REPO / name).read_text()
        assert script.updated(text, tables) == text, f"{name}: a code table differs from the registry; {RUN_SCRIPT}"
        listed += [code for table in tables for code in codes_of(*script.TABLES[table][0])]
    assert sorted(listed) == sorted(Code)  # every code in exactly one table


def test_the_script_rewrites_a_stale_table_and_refuses_a_missing_marker():
    script = _script()
    text = (REPO / "docs" / "rules-and-limits.md").read_text()
    stale = text.replace(
        f"| `{Code.FLAG_NOT_BOOLEAN.value}` | warning |", f"| `{Code.FLAG_NOT_BOOLEAN.value}` | error |"
    )
    assert stale != text and script.updated(stale, ("rule",)) == text
    with pytest.raises(ValueError, match="codes:rule"):
        script.updated(text.replace("<!-- /codes:rule -->", ""), ("rule",))


def test_the_script_checks_in_a_real_subprocess():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, f"{out.stderr}\n{RUN_SCRIPT}"
