"""Every command README.md, CONTRIBUTING.md and docs/*.md show still works, and their generated tables
and figures match the code.

A shown command is a line of a ```bash block, or a ``$ `` line of any block (continuation lines
joined). Each is checked in one of these ways, chosen by what it needs (``how_checked``); a command
no rule covers fails ``test_every_shown_command_is_covered``:

* run here: ``nemo-rl-attn-align`` commands that need only this checkout and the test extras
  (``RUN_HERE``), in-process or in a temporary folder; where the page shows output after the
  command, every shown line appears in the real output, in order (``...`` in a line stands for any
  text, a line ``...`` for lines left out);
* parsed: the other ``nemo-rl-attn-align`` commands, which need a GPU, a checkpoint, the user's
  own recipe, two engines' venvs or a minute-long sweep, go through the CLI's own parser (its
  sub-command, options and overrides are accepted as shown);
* ``pip install`` names only extras ``pyproject.toml`` defines; ``python -m pytest -m MARK`` a
  registered marker; ``python benchmarks/X.py`` and ``python scripts/X.py`` a script that exists
  and reads every option shown; a shell script exists and ``bash -n`` parses it;
* NeMo-RL's own launchers (``uv run examples/run_*.py``, which need a NeMo-RL checkout): the
  packaged example each names through ``$(nemo-rl-attn-align examples NAME)`` exists.

The README's set-up commands are what ``.ci/run`` runs (``test_ci_runs_the_readme_test_command``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from nemo_rl_attn_align.vocab.codes import Kind, codes_of

from .conftest import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
PAGES = ["README.md", "CONTRIBUTING.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]


def page(name: str) -> str:
    return (REPO / name).read_text()


# --- the commands the pages show ---------------------------------------------------------------


def shown_commands(name: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each command page ``name`` shows."""
    found = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", page(name), flags=re.S):
        lines = re.sub(r"\\\n\s*", "", body).splitlines()  # continuation lines joined
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                output = []
                for after in lines[i + 1 :]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
                found.append((line[2:], output))
            elif lang == "bash" and line.strip() and not line.startswith("#"):
                found.append((re.sub(r"\s+#.*$", "", line).strip(), []))
    return found


ALL_SHOWN = [(name, command, output) for name in PAGES for command, output in shown_commands(name)]
EXAMPLE = re.compile(r'"\$\(nemo-rl-attn-align examples (\S+)\)"')

#: The ``nemo-rl-attn-align`` commands run here: these whole commands, and those that start with
#: ``RUN_HERE_PREFIXES`` (no environment variable in front).
RUN_HERE = (
    "nemo-rl-attn-align check examples/configs/grpo_math_1B_megatron_flash.yaml",
    "nemo-rl-attn-align check examples/configs/grpo_math_1B_megatron_flash.yaml policy.precision=float32",
    "nemo-rl-attn-align check examples/configs/grpo_math_1B_megatron_flash_mismatch.yaml --fix",
    "nemo-rl-attn-align check examples/configs/grpo_math_1B_megatron_flash.yaml policy.model_name=results/step_100/hf "
    "--gpu sm90",
    'nemo-rl-attn-align check "$(nemo-rl-attn-align examples grpo_math_1B_megatron_flash.yaml)"',
    "nemo-rl-attn-align probe --make-envs probe-envs --print",
    "nemo-rl-attn-align probe train.json rollout.json",
)
RUN_HERE_PREFIXES = ("nemo-rl-attn-align report examples/sample-run/", "echo ")


def words(command: str) -> list[str]:
    """The command's words, the packaged example's path put for ``$(nemo-rl-attn-align examples NAME)``
    and the environment variables in front dropped."""
    from nemo_rl_attn_align.config.example_recipes import EXAMPLES_DIR

    command = EXAMPLE.sub(lambda m: shlex.quote(str(EXAMPLES_DIR / m.group(1))), command)
    split = shlex.split(command)
    while split and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", split[0]):
        split.pop(0)
    return split


def how_checked(part: str) -> str:
    """Which check covers ``part`` (one command of a ``&&`` chain; see the module's docstring)."""
    first = part.split()
    if part in RUN_HERE or part.startswith(RUN_HERE_PREFIXES):
        return "run"
    if first[0] == "cat":
        return "shown file"
    if re.match(r"([A-Z_]+=\S+ )*nemo-rl-attn-align ", part):
        return "parse"
    if first[:2] == ["pip", "install"]:
        return "pip"
    if first[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if first[0] == "python" and first[1].startswith(("benchmarks/", "scripts/")):
        return "script"
    if first[0].endswith(".sh") or first[0] == "bash":
        return "shell"
    if first[:2] == ["uv", "run"] and first[2].startswith("examples/run_"):
        return "nemo-rl"
    return "uncovered"


#: (page, one command of a ``&&`` chain, the output shown after the chain) for every command shown.
PARTS = [(name, part, output) for name, command, output in ALL_SHOWN for part in command.split(" && ")]


def checked(how: str) -> list[tuple[str, str]]:
    return [(name, part) for name, part, _ in PARTS if how_checked(part) == how]


def test_every_shown_command_is_covered():
    assert checked("uncovered") == []
    assert len(PARTS) > 30  # the pages' blocks were found


def cli_args(part: str) -> list[str]:
    """The arguments after ``nemo-rl-attn-align``, optional parts of a synopsis (``[...]``) left out."""
    split = words(re.sub(r"\s*\[[^\]]*\]", "", part))
    return split[split.index("nemo-rl-attn-align") + 1 :]


def parse(args: list[str]) -> None:
    """``args`` through the CLI's own parser, as ``cli._dispatch`` parses them (nothing runs)."""
    from nemo_rl_attn_align.cli import build_parser

    parser = build_parser(args)
    parsed, rest = parser.parse_known_args(args)
    assert not rest or (getattr(parsed, "overrides_dest", None) and not any(t.startswith("-") for t in rest)), rest


@pytest.mark.parametrize("name,part", checked("run") + checked("parse"))
def test_every_shown_plugin_command_parses(name, part):
    if part.startswith("echo "):
        return
    parse(cli_args(part))
    if "nemo-rl-attn-align run --" in part:  # the launcher's COMMAND is NeMo-RL's own
        assert how_checked(part.split(" -- ", 1)[1]) == "nemo-rl"


def run_cli(args: list[str], cwd: Path) -> tuple[int, str]:
    from nemo_rl_attn_align.cli import main

    out = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            code = main(args)
    finally:
        os.chdir(here)
    return code, out.getvalue()


def shows(output: list[str], printed: str) -> bool:
    """Every shown line is in ``printed``, in order; ``...`` stands for any text (a whole line of it:
    lines left out)."""
    lines = iter(printed.splitlines())
    for shown in output:
        if shown.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in shown.split("...")))
        if not any(pattern.fullmatch(line) for line in lines):
            return False
    return True


RUN_IN_PROCESS = [
    (name, part, output)
    for name, part, output in PARTS
    if how_checked(part) == "run" and not part.startswith(("echo ", "nemo-rl-attn-align probe"))
]


#: The local model directories shown commands name: (model type, config arguments) of its config.json.
MODEL_DIRS = {"results/step_100/hf": ("gpt_oss", {"num_hidden_layers": 24})}


@pytest.mark.parametrize("name,part,output", RUN_IN_PROCESS)
def test_the_commands_run_here_print_what_the_page_shows(name, part, output, tmp_path, monkeypatch):
    """Run in a folder holding the checkout's ``examples`` and the model directories the command names."""
    from tests.example_models import write_transformers_config

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))  # the shown output has no cached model
    for variable in [k for k in os.environ if k.startswith("NVTE_")]:  # nor NVTE_* set in the shell
        monkeypatch.delenv(variable)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for folder, (model_type, config) in MODEL_DIRS.items():
        if folder in part:
            write_transformers_config(tmp_path / folder, model_type, **config)
    code, printed = run_cli(cli_args(part), tmp_path)
    assert code in (0, 1), printed
    assert shows(output, printed), f"{name}: {part}\n{printed}"
    if "--plot" in part:
        assert (tmp_path / "sample-run.png").stat().st_size > 10_000


def test_the_side_file_probe_prints_what_the_readme_and_docs_probe_show(tmp_path):
    pytest.importorskip("megatron.core")
    shown = {}
    for name in ("README.md", "docs/probe.md"):
        commands = shown_commands(name)
        for command, _ in [c for c in commands if c[0].startswith("echo ")]:
            subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
        shown[name] = [o for c, o in commands if c == "nemo-rl-attn-align probe train.json rollout.json"]
    assert len(shown["README.md"]) == len(shown["docs/probe.md"]) == 1
    code, printed = run_cli(["probe", "train.json", "rollout.json"], tmp_path)
    assert code == 0
    for name, [output] in shown.items():
        assert shows(output, printed), f"{name}\n{printed}"


def test_shown_side_files_are_json_objects():
    import json

    for name, command, output in ALL_SHOWN:
        if how_checked(command) == "shown file":
            assert isinstance(json.loads("\n".join(output)), dict), f"{name}: {command}"


def test_pip_installs_name_defined_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads(page("pyproject.toml"))["project"]["optional-dependencies"]
    for name, part in checked("pip"):
        for extra in re.findall(r"\.\[([a-z,]+)\]", part):
            assert set(extra.split(",")) <= set(extras), f"{name}: {part}"


def test_pytest_commands_name_registered_markers():
    markers = page("pyproject.toml")
    for name, part in checked("pytest"):
        for mark in re.findall(r"-m (\w+)", part.split("pytest", 1)[1]):
            assert f'"{mark}:' in markers, f"{name}: {part}"


def test_scripts_exist_and_read_every_option_shown():
    for name, part in checked("script"):
        script, *args = part.split()[1:]
        source = page(script)
        for option in (a for a in args if a.startswith("--")):
            assert f'"{option}"' in source, f"{name}: {part}: {script} reads no {option}"


def test_shell_scripts_exist_and_parse():
    for name, part in checked("shell"):
        script = next(w for w in part.split() if w.endswith(".sh") or w.startswith(".ci/"))
        assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0, f"{name}: {part}"


def test_nemo_rl_launchers_name_packaged_examples():
    from nemo_rl_attn_align.config.example_recipes import EXAMPLES_DIR

    for name, part in checked("nemo-rl"):
        for example in EXAMPLE.findall(part):
            assert (EXAMPLES_DIR / example).is_file(), f"{name}: {part}"


def test_every_relative_link_reaches_a_file_and_heading():
    for name in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page(name)):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (REPO / name).parent / path if path else REPO / name
            assert file.exists(), f"{name}: {target}"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{name}: {target}"


# --- the README and .ci/run ------------------------------------------------------------------


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest' in README
    assert 'pip install -q torch==2.13.0 -e ".[test]"' in ci and "python -m pytest" in ci


def test_the_readme_stays_the_users_path():
    assert len(README.splitlines()) <= 250


# --- generated tables and stated figures -------------------------------------------------------

RULES = page("docs/rules-and-limits.md")
CHECK_CODES = (*codes_of(Kind.RULE), *codes_of(Kind.KERNEL))


def test_every_check_code_is_documented_with_its_summary_and_severity():
    for code in CHECK_CODES:
        assert f"| `{code.value}` | {code.severity.value} | {code.summary} |" in RULES, code


def test_no_undocumented_code_in_the_rule_table():
    table_codes = set(re.findall(r"^\| `([A-Z0-9_]+)` \| (?:error|warning|info) \|", RULES, flags=re.M))
    assert table_codes <= {c.value for c in CHECK_CODES}


def test_supported_versions_table_is_generated_from_the_data():
    from nemo_rl_attn_align.vocab.host_versions import supported_table

    assert supported_table() in page("docs/running-in-nemo-rl.md")


def test_the_contract_page_states_the_contract_field_count():
    from nemo_rl_attn_align.vocab.schema import FIELD_NAMES

    assert f"*attention contract* ({len(FIELD_NAMES)} fields," in page("docs/contract-and-report.md").replace("\n", " ")


# --- the probe's commands (docs/probe.md) ------------------------------------------------------

PROBE_DOC = page("docs/probe.md")


def console_block(text: str, command: str) -> tuple[str, list[str]]:
    """The console block whose ``$`` line starts with ``command``: (the command, its output lines)."""
    block = re.search(rf"```console\n\$ ({re.escape(command)}(?:[^\n]*\\\n)*[^\n]*)\n(.*?)```", text, flags=re.S)
    assert block is not None, command
    return re.sub(r"\\\n\s*", "", block.group(1)), block.group(2).splitlines()  # continuation lines joined


def test_the_make_envs_command_docs_probe_shows_prints_what_it_shows(tmp_path):
    command, shown = console_block(PROBE_DOC, "nemo-rl-attn-align probe --make-envs")
    code, printed = run_cli(shlex.split(command)[1:], tmp_path)
    assert code == 0
    # the interpreters found differ between machines: the docs name them by version
    lines = [
        re.sub(r"^\S*/(python3\.\d+|python)( -m venv probe-envs/(\w+))", _versioned, line)
        for line in printed.splitlines()
    ]
    assert lines == shown


def test_the_make_envs_command_the_readme_names_is_the_one_docs_probe_prints():
    command, _ = console_block(PROBE_DOC, "nemo-rl-attn-align probe --make-envs")
    assert command.removesuffix(" --print") in README and command.endswith(" --print")


def _versioned(match: re.Match) -> str:
    from nemo_rl_attn_align.probe.envs import ENVS

    return f"python{ENVS[match.group(3)].python}{match.group(2)}"


def test_the_recipe_probe_on_cpu_is_the_command_the_cross_engine_stage_runs():
    from tests.real_cross_engine.test_recipe_probe import ON_CPU

    command, _ = console_block(PROBE_DOC, "VLLM_CPU_KVCACHE_SPACE=1 nemo-rl-attn-align probe")
    split = shlex.split(command, posix=True)
    assert [w for w in split if "=" in w and w.startswith(("policy.", "++policy."))] == [
        "policy.model_name=tiny-llama",
        *ON_CPU,
    ]
    assert "--training-python probe-envs/training/bin/python --rollout-python probe-envs/rollout/bin/python" in command
