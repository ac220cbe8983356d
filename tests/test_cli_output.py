"""Every sub-command's output to a closed pipe or a full device: real subprocesses, real pipes.

A reader that stops early (``check --json | head -c1``) ends the command quietly with the exit code
its result says; output that cannot be written otherwise (``> /dev/full``) is one line on stderr and
exit 2. Never a traceback (``cli.main`` guards the standard streams once for every sub-command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import EXAMPLES, REPO

GRPO = str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
CLI = [sys.executable, "-m", "nemo_rl_attn_align"]
FULL_LINE = "error: cannot write the output: No space left on device\n"


def closed_early(*args: str) -> tuple[int, str]:
    """Run the CLI with its stdout a pipe whose reading end is closed before it writes anything
    (so the first write fails with EPIPE); its exit code and stderr."""
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=60), err


@pytest.mark.parametrize(
    "args, code",
    [
        (["check", "--json", GRPO], 0),
        (["check", GRPO], 0),
        (["check", "--json", GRPO, "policy.precision=float32"], 1),  # FAIL: flash needs half precision
        (["check", "--json", "/missing.yaml"], 2),
        (["examples"], 0),
        (["--help"], 0),
    ],
    ids=["check-json-ok", "check-text-ok", "check-fail", "check-missing-file", "examples", "help"],
)
def test_a_closed_pipe_exits_as_the_result_says_without_a_traceback(args, code):
    exit_code, err = closed_early(*args)
    assert exit_code == code
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err
    if code == 2:  # the input error itself is still said, on one line
        assert err.count("\n") == 1 and err.startswith("error: config file /missing.yaml does not exist")
    else:
        assert err == ""


@pytest.mark.parametrize(
    "command, statuses",
    [
        (f"{' '.join(CLI)} check {GRPO} --json | head -c1", [0, 0]),  # 68 KB: more than the pipe holds
        (f"{' '.join(CLI)} check --json {GRPO} policy.precision=float32 | head -c1", [1, 0]),
        (f"{' '.join(CLI)} check /missing.yaml --json | true", [2, 0]),
    ],
    ids=["ok-head", "fail-head", "missing-true"],
)
def test_shell_pipelines_keep_the_exit_code(command, statuses):
    proc = subprocess.run(
        ["bash", "-c", f'set -o pipefail; {command} >/dev/null; echo "status ${{PIPESTATUS[*]}}" >&2'],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    *lines, last = proc.stderr.splitlines()
    assert last == "status " + " ".join(map(str, statuses))
    assert not any("Traceback" in line or "Error:" in line for line in lines), lines


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full exists on Linux only")
@pytest.mark.parametrize(
    "args",
    [["check", "--json", GRPO], ["check", GRPO], ["check", "--json", "/missing.yaml"], ["examples"], ["--help"]],
    ids=["check-json", "check-text", "check-missing-file", "examples", "help"],
)
def test_a_full_device_is_one_line_and_exit_2(args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*CLI, *args], stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.endswith(FULL_LINE) and "Traceback" not in proc.stderr
    # the missing file's own line comes first; nothing else is said
    assert proc.stderr.count("\n") == (2 if "/missing.yaml" in args else 1)


@pytest.mark.parametrize(("argv", "fast"), [(["check", GRPO, "--json"], True), (["examples"], False)])
def test_the_console_script_ends_check_without_the_interpreters_teardown(monkeypatch, capsys, argv, fast):
    """``cli.console``: ``check`` leaves through ``os._exit`` with its exit code, its output flushed
    first (the whole JSON is there); any other command through ``sys.exit``."""
    from nemo_rl_attn_align import cli

    ended: list[tuple[str, int]] = []

    def record(how: str):
        def end(code):
            ended.append((how, code))
            raise SystemExit(code)

        return end

    monkeypatch.setattr(os, "_exit", record("os._exit"))
    monkeypatch.setattr(sys, "exit", record("sys.exit"))
    monkeypatch.setattr(sys, "argv", ["nemo-rl-attn-align", *argv])
    with pytest.raises(SystemExit):
        cli.console()
    assert ended == [("os._exit" if fast else "sys.exit", 0)]
    out = capsys.readouterr().out
    assert (json.loads(out)["exit_code"] == 0) if fast else out
