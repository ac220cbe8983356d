"""The README's rule table (rules and kernel findings) and set-up commands match the code."""

from __future__ import annotations

import re

from nemo_rl_attn_align.vocab.codes import Kind, codes_of

from .conftest import REPO

README = (REPO / "README.md").read_text()


CHECK_CODES = (*codes_of(Kind.RULE), *codes_of(Kind.KERNEL))


def test_every_check_code_is_documented_with_its_summary_and_severity():
    for code in CHECK_CODES:
        assert f"| `{code.value}` | {code.severity.value} | {code.summary} |" in README, code


def test_no_undocumented_code_in_the_readme_table():
    table_codes = set(re.findall(r"^\| `([A-Z0-9_]+)` \| (?:error|warning|info) \|", README, flags=re.M))
    assert table_codes <= {c.value for c in CHECK_CODES}


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest' in README
    assert 'pip install -q torch==2.13.0 -e ".[test]"' in ci and "python -m pytest" in ci


def test_supported_versions_table_is_generated_from_the_data():
    from nemo_rl_attn_align.hosts.versions import supported_table

    assert supported_table() in README


def test_readme_states_the_contract_field_count():
    from nemo_rl_attn_align.vocab.schema import FIELD_NAMES

    assert f"*attention contract* ({len(FIELD_NAMES)} fields," in README.replace("\n", " ")
