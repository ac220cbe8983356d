"""Bounds on every input the plugin reads, and the one bounded file reader (stdlib only).

A hostile or broken input (a YAML alias bomb, a 50 MB string, a FIFO or ``/dev/zero`` given as a
file, a JSON record nested thousands of levels deep, an override path hundreds of keys long) is
refused with one line before it can cost time or memory. The README's "Limits" table lists these
values; ``benchmarks/fuzz_check.py --hostile`` measures that each refusal takes well under a second.
"""

from __future__ import annotations

import os
import stat
from typing import Any

#: Largest config YAML file (each file of a ``defaults:`` chain); NeMo-RL's recipes are 5-25 KB.
MAX_CONFIG_BYTES = 256 << 10
#: Most YAML values a config (all files of its ``defaults:`` chain together) may compose and expand
#: to, aliases counted at every use (NeMo-RL's largest recipes have ~870); counted while composing
#: and on the composed node graph, before any value is built.
MAX_CONFIG_NODES = 5_000
#: Deepest nesting of mappings/lists in a config file, a JSON record or report (NeMo-RL uses ~6).
MAX_NESTING = 32
#: Most files in one ``defaults:`` chain.
MAX_DEFAULTS_FILES = 16
#: Longest command-line override (characters) and most dotted levels in its key.
MAX_OVERRIDE_CHARS = 10_000
MAX_OVERRIDE_KEY_DEPTH = MAX_NESTING
#: Most command-line overrides in one command. A NeMo-RL command line carries a few to a few dozen;
#: Hydra parses and applies each on its own (about 0.35 ms each), so 1,000 cost a third of a second
#: where 10,000 took 3.4 s.
MAX_OVERRIDES = 1_000
#: All overrides' text together (characters): a few KB in practice; 64 KiB is six overrides of the
#: longest kind and bounds the per-character checks and Hydra's lexer (~25 ms per 10,000 characters).
MAX_OVERRIDES_TOTAL_CHARS = 64 << 10
#: Most list / mapping / sweep elements in all overrides together, counted as the commas outside
#: quoted strings. Hydra's grammar parses a list in time growing with the square of its length
#: (1,000 elements ~0.2 s, 4,900 elements 2.4 s); a long list belongs in the YAML file.
MAX_OVERRIDE_ELEMENTS = 1_000
#: Largest worker record / host detail file, and largest run report file.
MAX_RECORD_BYTES = 4 << 20
MAX_REPORT_BYTES = 64 << 20
#: Longest value shown inside an error line (longer ones are cut, with their length).
MAX_SHOWN_CHARS = 120


class InputRefused(ValueError):
    """A file or value refused by a limit; ``str(err)`` is one line naming it and the limit."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def read_text(path: os.PathLike[str] | str, limit: int, what: str) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes.

    Opens without blocking (a FIFO never hangs), refuses anything but a regular file and any file
    over ``limit`` before reading it; ``InputRefused`` (one line), ``OSError`` from the open itself
    (missing, permission, symlink loop, name too long) and ``UnicodeDecodeError`` propagate."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputRefused(f"{what} {shown_path(path)} is a {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise InputRefused(f"{what} {shown_path(path)} is {info.st_size} bytes, over the limit of {limit}")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise InputRefused(f"{what} {shown_path(path)} grew past the limit of {limit} bytes while being read")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (its full length said) for error lines."""
    try:
        text = repr(value)
    except Exception as err:
        text = f"<{type(value).__name__}: {type(err).__name__}>"
    return shown_text(text, limit)


def shown_path(path: Any, limit: int = 2 * MAX_SHOWN_CHARS) -> str:
    """A path for an error line: control characters escaped, cut when very long."""
    return shown_text(os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path), limit)


def shown_text(text: str, limit: int = 2 * MAX_SHOWN_CHARS) -> str:
    """``text`` on one line (control characters escaped), cut to ``limit`` characters, its length said."""
    text = one_line(text)
    return text if len(text) <= limit else f"{text[: max(limit - 20, 1)]}...({len(text)} chars)"


def first_line(text: Any) -> str:
    """The first line of an exception text, control characters escaped and cut for an error line."""
    lines = str(text).splitlines()
    return shown_text(lines[0]) if lines else ""


def one_line(text: str) -> str:
    """``text`` with newlines and other control characters escaped, so a message stays one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text)
