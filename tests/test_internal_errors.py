"""An internal error never looks like a verdict (issue #40, item 3): an exception no command expects
is one line naming the command, the exception and where to report it, and exit code 3 (not 0, 1 or
2); inside NeMo-RL's processes it is a warning and a finding, and the run goes on (strict mode aside).
Every command and ``python -m`` entry takes its exit codes from ``vocab.exit_codes``."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from nemo_rl_attn_align.cli import COMMANDS, main
from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.hosts import driver_report, handoff, megatron_worker, nemo_rl_driver
from nemo_rl_attn_align.vocab.errors import RuleViolation, UsageError
from nemo_rl_attn_align.vocab.exit_codes import EXIT_FAILED, EXIT_INTERNAL_ERROR, EXIT_OK, EXIT_UNUSABLE, ISSUES_URL
from tests.fake_nemo_rl.configs import policy_config

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
#: The functions whose return value is a process's exit code (the CLI's, the side processes').
ENTRY_POINTS = ("run", "main", "_run", "console", "side_main")
README = Path(__file__).resolve().parents[1] / "README.md"

#: For each command: an internal function to break, and arguments that reach it.
BREAK_POINTS = {
    "check": ("nemo_rl_attn_align.cli.check", "evaluate", []),
    "report": ("nemo_rl_attn_align.report.load", "load_report", ["somewhere"]),
    "drift": ("nemo_rl_attn_align.cli.drift", "_prepare", []),
    "probe": ("nemo_rl_attn_align.cli.probe", "_sides", ["a.json", "b.json"]),
    "examples": ("nemo_rl_attn_align.config.example_recipes", "example_paths", []),
    "run": ("nemo_rl_attn_align.cli.run", "launch_environment", ["--", "true"]),
}


def _boom(*args, **kwargs):
    raise RuntimeError("boom\nsecond line")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unexpected_exception_is_one_line_and_its_own_exit_code(command, monkeypatch, capsys):
    module, name, argv = BREAK_POINTS[command]
    monkeypatch.setattr(f"{module}.{name}", _boom)
    assert main([command, *argv]) == EXIT_INTERNAL_ERROR
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"nemo-rl-attn-align {command}: internal error RuntimeError at ")
    assert "boom" in err and "second line" not in err and ISSUES_URL in err and "not a verdict" in err


def test_the_console_script_of_check_ends_with_it_too(tmp_path):
    """``check`` ends through ``os._exit`` (``FAST_EXIT``): the code survives it."""
    script = (
        "import sys, nemo_rl_attn_align.cli as cli, nemo_rl_attn_align.cli.check as check\n"
        "def boom(*a, **k): raise KeyError('x')\n"
        "check.evaluate = boom\n"
        "sys.argv = ['nemo-rl-attn-align', 'check']\n"
        "cli.console()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_INTERNAL_ERROR
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("nemo-rl-attn-align check: internal error KeyError at <string>:2: 'x'. ")


def test_the_codes_have_one_home_and_the_readme_names_each():
    """No module defines an exit code or returns a bare number from a command or ``python -m`` entry
    (the CLI's and the side processes' mains); the README's table says each."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "exit_codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                names += [
                    e.id for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)
                ]
                assert not any(n.startswith("EXIT_") for n in names), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.FunctionDef) and node.name in ENTRY_POINTS:
                for returned in ast.walk(node):
                    if isinstance(returned, ast.Return) and isinstance(returned.value, ast.Constant):
                        assert not isinstance(returned.value.value, int), f"{path.name}:{returned.lineno}"
    text = README.read_text(encoding="utf-8")
    table = text.split("### Exit codes", 1)[1].split("\n\n", 3)[2]
    for code in (EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERNAL_ERROR):
        assert f"\n| {code} |" in "\n" + table, code


# --- inside NeMo-RL's processes ---------------------------------------------------------------


@pytest.fixture
def worker_env(monkeypatch, tmp_path):
    for name in (handoff.SETTINGS_ENV, handoff.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(handoff.REPORT_DIR_ENV, str(tmp_path / "report"))
    monkeypatch.setattr(megatron_worker, "record", megatron_worker.TrainingRecord())
    return monkeypatch


def test_a_bug_in_the_workers_check_is_a_finding_and_the_worker_goes_on(worker_env, caplog):
    worker_env.setattr("nemo_rl_attn_align.preflight.plan.build_plan_for_policy", _boom)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        megatron_worker.check_policy(policy_config("flash"))
    [warning] = [r.getMessage() for r in caplog.records]
    assert "checking the policy config failed (RuntimeError: boom" in warning and "the run goes on" in warning
    assert megatron_worker.record.findings == ["checking the policy config failed (RuntimeError: boom\nsecond line)"]
    worker_env.setenv(handoff.STRICT_ENV, "1")
    with pytest.raises(RuntimeError, match="boom"):
        megatron_worker.check_policy(policy_config("flash"))


def test_the_workers_own_stops_still_stop(worker_env):
    with pytest.raises(RuleViolation, match="FLASH_REQUIRES_HALF_PRECISION"):
        megatron_worker.check_policy(policy_config("flash", "float32", impl="transformer_engine"))


@pytest.fixture
def recipe(monkeypatch, tmp_path):
    for name in (handoff.SETTINGS_ENV, handoff.REPORT_DIR_ENV, handoff.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    cfg = load_config(default_example_path(), [f"logger.log_dir={tmp_path / 'logs'}"])
    yield cfg
    driver_report.stop()
    monkeypatch.delenv(handoff.SETTINGS_ENV, raising=False)


def test_a_bug_in_the_drivers_check_is_a_warning_and_setup_goes_on(recipe, monkeypatch, caplog):
    monkeypatch.setattr("nemo_rl_attn_align.preflight.recipe_facts.read_recipe_facts", _boom)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        assert nemo_rl_driver.prepare(recipe) is None
    assert any(
        "checking the config before setup() failed (RuntimeError: boom" in r.getMessage() for r in caplog.records
    )
    with pytest.raises(RuntimeError, match="boom"):
        nemo_rl_driver.prepare({**recipe, "attention_align": {"strict": True}})


def test_the_drivers_own_stops_still_stop(recipe):
    with pytest.raises(UsageError, match="on_mismatch"):
        nemo_rl_driver.prepare({**recipe, "attention_align": {"on_mismatch": "sometimes"}})
    with pytest.raises(RuleViolation, match="FLASH_REQUIRES_HALF_PRECISION"):
        nemo_rl_driver.prepare({**recipe, "policy": {**recipe["policy"], "precision": "float32"}})


def test_a_bug_while_reading_a_steps_metrics_never_breaks_the_training_loop(monkeypatch, caplog):
    class Metric:
        def __float__(self):
            raise RuntimeError("a tensor on a lost device")

    run = nemo_rl_driver.driver_report.RunReport.__new__(nemo_rl_driver.driver_report.RunReport)
    run.settings = types.SimpleNamespace(strict=False, log_metrics=False, report_dir="unused")
    run.finished, run.stepped, run.doc = False, True, None
    run._lock = __import__("threading").RLock()
    monkeypatch.setattr(driver_report, "current", run)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        driver_report.train_metrics({"loss": 1.0, "token_mult_prob_error": Metric()}, 3, "train")
    assert any("a tensor on a lost device" in r.getMessage() for r in caplog.records)
    run.settings.strict = True
    with pytest.raises(RuntimeError, match="lost device"):
        driver_report.train_metrics({"loss": 1.0, "token_mult_prob_error": Metric()}, 3, "train")
