"""``nemo-rl-attn-align run -- COMMAND``: the explicit launcher, for where nothing automatic is allowed.

It runs COMMAND (``exec``, same process id) with the plugin's ``PYTHONPATH`` shim first on
``PYTHONPATH``, so every Python process COMMAND starts -- the driver, Ray actors in other venvs,
vLLM's workers -- activates the plugin at start and chains to its own ``sitecustomize``. Like
``opentelemetry-instrument`` and ``ddtrace-run``. Interpreters started with ``-I`` or ``-E`` ignore
``PYTHONPATH`` and stay untouched.
"""

from __future__ import annotations

import argparse
import os
import sys

from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE

EXAMPLE = "nemo-rl-attn-align run -- uv run examples/run_grpo.py --config my.yaml"


def register(subparsers) -> None:
    """Add the ``run`` sub-command."""
    parser = subparsers.add_parser(
        "run",
        help="run a command with the plugin active in it and in every Python process it starts",
        description=__doc__.split("\n\n", 1)[1].replace("``", ""),
    )
    parser.add_argument(
        "--report-dir", help="where workers write their records (default: attention_align.report_dir from the config)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="stop the run when a layout is not recognised or a read-back differs"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    parser.set_defaults(handler=run)


def launch_environment(environ, report_dir: str | None = None, strict: bool = False) -> dict[str, str]:
    """The environment COMMAND runs in: ``environ`` plus the shim, and the chosen settings."""
    from nemo_rl_attn_align.hosts import bootstrap, handoff

    env = dict(environ)
    if not bootstrap.enabled(env):
        return env
    bootstrap.export_shim(env)
    if report_dir:
        env[handoff.REPORT_DIR_ENV] = os.path.abspath(report_dir)
    if strict:
        env[handoff.STRICT_ENV] = "1"
    return env


def run(args) -> int:
    """Replace this process with the command; exit 2 when there is none or it cannot be found."""
    from nemo_rl_attn_align.hosts import bootstrap

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print(f"error: run needs a command after --. Fix: {EXAMPLE}", file=sys.stderr)
        return EXIT_UNUSABLE
    if not bootstrap.enabled():
        print(f"nemo-rl-attn-align: {bootstrap.SWITCH}=0, so the command runs without the plugin", file=sys.stderr)
    env = launch_environment(os.environ, args.report_dir, args.strict)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        print(
            f"error: cannot run {command[0]!r}: {err.strerror}. Fix: check the command and PATH ({EXAMPLE})",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    return EXIT_OK  # pragma: no cover - execvpe does not return
