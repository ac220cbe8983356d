"""The README's rule table (rules and kernel findings) and set-up commands match the code; the probe
commands the README and docs/probe.md show run here (``--make-envs --print``) or in the cross-engine
stage (the recipe on CPU) as shown."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex

import pytest

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
    from nemo_rl_attn_align.vocab.host_versions import supported_table

    assert supported_table() in README


def test_readme_states_the_contract_field_count():
    from nemo_rl_attn_align.vocab.schema import FIELD_NAMES

    assert f"*attention contract* ({len(FIELD_NAMES)} fields," in README.replace("\n", " ")


PROBE_DOC = (REPO / "docs" / "probe.md").read_text()


def console_block(text: str, command: str) -> tuple[str, list[str]]:
    """The console block whose ``$`` line starts with ``command``: (the command, its output lines)."""
    block = re.search(rf"```console\n\$ ({re.escape(command)}(?:[^\n]*\\\n)*[^\n]*)\n(.*?)```", text, flags=re.S)
    assert block is not None, command
    return re.sub(r"\\\n\s*", "", block.group(1)), block.group(2).splitlines()  # continuation lines joined


def test_the_make_envs_command_docs_probe_shows_prints_what_it_shows(tmp_path):
    from nemo_rl_attn_align.cli import main

    command, shown = console_block(PROBE_DOC, "nemo-rl-attn-align probe --make-envs")
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            assert main(shlex.split(command)[1:]) == 0
    finally:
        os.chdir(cwd)
    # the interpreters found differ between machines: the docs name them by version
    printed = [
        re.sub(r"^\S*/(python3\.\d+|python)( -m venv probe-envs/(\w+))", _versioned, line)
        for line in out.getvalue().splitlines()
    ]
    assert printed == shown


def test_the_make_envs_command_the_readme_shows_is_the_one_docs_probe_prints():
    command, _ = console_block(PROBE_DOC, "nemo-rl-attn-align probe --make-envs")
    assert command.removesuffix(" --print") in README and command.endswith(" --print")


def _versioned(match: re.Match) -> str:
    from nemo_rl_attn_align.probe.envs import ENVS

    return f"python{ENVS[match.group(3)].python}{match.group(2)}"


@pytest.mark.parametrize("page", ["README.md", "docs/probe.md"])
def test_the_recipe_probe_on_cpu_is_the_command_the_cross_engine_stage_runs(page):
    from tests.real_cross_engine.test_recipe_probe import ON_CPU

    command, _ = console_block((REPO / page).read_text(), "VLLM_CPU_KVCACHE_SPACE=1 nemo-rl-attn-align probe")
    words = shlex.split(command, posix=True)
    assert [w for w in words if "=" in w and w.startswith(("policy.", "++policy."))] == [
        "policy.model_name=tiny-llama",
        *ON_CPU,
    ]
    assert "--training-python probe-envs/training/bin/python --rollout-python probe-envs/rollout/bin/python" in command
