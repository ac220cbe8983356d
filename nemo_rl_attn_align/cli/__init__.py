"""The ``nemo-rl-attn-align`` command line.

Each sub-command lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and sets ``handler`` to a function ``(args) -> exit code``. Command modules
import nothing heavy at module level: ``check`` must stay well under a second.

``main`` runs every sub-command with guarded standard streams: a reader that closes the pipe early
(``check --json | head -c1``) ends the command silently with the exit code its result says; any
other failure to write the output (``> /dev/full``) is one line on stderr and exit 2. An exception
no command expects is a bug of ours, never a verdict: one line naming the command, the exception
and where to report it, and ``EXIT_INTERNAL_ERROR`` (``exit_codes`` holds every code).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import Any, NoReturn, TextIO, cast

from nemo_rl_attn_align import __version__
from nemo_rl_attn_align.vocab.exit_codes import EXIT_INTERNAL_ERROR, EXIT_UNUSABLE, ISSUES_URL

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = ("check", "report", "drift", "probe", "run", "examples")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser. When ``argv`` starts with a sub-command's name only that one is
    registered (so ``check`` does not import what ``drift`` needs); otherwise all of them are."""
    chosen = [name for name in COMMANDS if argv and argv[0] == name] or list(COMMANDS)
    parser = argparse.ArgumentParser(
        prog="nemo-rl-attn-align",
        description="Attention-backend pre-flight checks and train/rollout attention contracts for NeMo-RL.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in chosen:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


class _GuardedStream:
    """A standard stream whose first write error (a closed pipe, a full disk) is kept in ``error``
    instead of raised; from then on writes are dropped and the file descriptor points at devnull, so
    neither the rest of the command nor the interpreter's flush at exit raises again (the recipe of
    https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)
            except OSError as err:
                self._failed(err)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.error is None:
            try:
                self._stream.flush()
            except OSError as err:
                self._failed(err)

    def _failed(self, err: OSError) -> None:
        self.error = err
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            os.dup2(devnull, self._stream.fileno())
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (io.StringIO)
            pass
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run its command. A command whose parser sets ``overrides_dest`` (the
    positional holding CONFIG and its overrides) takes overrides wherever they stand, after options
    too (``check CONFIG --gpu H100 a.b=1``); anything else left over is argparse's usage error."""
    parser = build_parser(argv)
    args, rest = parser.parse_known_args(argv)
    dest: str | None = getattr(args, "overrides_dest", None)
    if rest and (dest is None or any(token.startswith("-") for token in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest and dest is not None:
        setattr(args, dest, [*getattr(args, dest), *rest])
    return args.handler(args)


def internal_error_line(argv: list[str], err: Exception) -> str:
    """The one line an unexpected exception becomes: the command, the exception, where it was
    raised, and where to report it."""
    import traceback

    from nemo_rl_attn_align.vocab.limits import first_line

    command = argv[0] if argv and argv[0] in COMMANDS else "(no command)"
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    said = f": {first_line(err)}" if first_line(err) else ""
    return (
        f"nemo-rl-attn-align {command}: internal error {type(err).__name__}{where}{said}. "
        f"This is a bug in nemo-rl-attn-align {__version__}, not a verdict on the input; please report it "
        f"with this line and the command you ran at {ISSUES_URL}"
    )


def _write_failure(out: _GuardedStream) -> str | None:
    """The error line when stdout failed other than by its reader closing the pipe (None then)."""
    err = out.error
    if err is None or isinstance(err, BrokenPipeError) or err.errno == errno.EPIPE:
        return None
    return f"error: cannot write the output: {err.strerror or err}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code. stdout and stderr are
    guarded for the whole command (argparse's ``--help`` included): a closed pipe ends it quietly
    with the command's own exit code, another write error (ENOSPC, EIO) is one line and exit 2; an
    unexpected exception is ``internal_error_line`` and ``EXIT_INTERNAL_ERROR``."""
    argv = sys.argv[1:] if argv is None else argv
    saved = sys.stdout, sys.stderr
    out = _GuardedStream(saved[0]) if saved[0] is not None else None
    err = _GuardedStream(saved[1]) if saved[1] is not None else None
    sys.stdout, sys.stderr = cast(TextIO, out), cast(TextIO, err)
    try:
        try:
            code = _dispatch(argv)
        except SystemExit:  # argparse: --help, --version, a usage error
            failure = _flushed(out, err)
            if failure is None:
                raise
            print(failure, file=sys.stderr)
            raise SystemExit(EXIT_UNUSABLE) from None
        except Exception as exc:  # a bug of ours: one line, its own exit code, never a verdict
            print(internal_error_line(argv, exc), file=sys.stderr)
            code = EXIT_INTERNAL_ERROR
        failure = _flushed(out, err)
        if failure is not None:
            print(failure, file=sys.stderr)
            return EXIT_UNUSABLE if code != EXIT_INTERNAL_ERROR else code
        return code
    finally:
        sys.stdout, sys.stderr = saved


#: Commands whose process ends without the interpreter's teardown once ``main`` has flushed their
#: output: they leave no thread, subprocess, temporary file or atexit handler behind, and freeing
#: every object the imports made is about 20 ms of ``check``'s wall time (benchmarks/check_walltime.py).
FAST_EXIT = ("check",)


def console() -> NoReturn:
    """The console script (and ``python -m nemo_rl_attn_align``): ``main``'s exit code, through
    ``os._exit`` for the ``FAST_EXIT`` commands."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in FAST_EXIT:
        os._exit(code)
    sys.exit(code)


def _flushed(out: _GuardedStream | None, err: _GuardedStream | None) -> str | None:
    """Flush both guarded streams (a late error is caught here, not at exit); stdout's error line."""
    for stream in (out, err):
        if stream is not None:
            stream.flush()
    return _write_failure(out) if out is not None else None


if __name__ == "__main__":  # pragma: no cover - python -m nemo_rl_attn_align.cli
    console()
