"""Bounds on every input the plugin reads, and the one bounded file reader (stdlib only).

A hostile or broken input (a YAML alias bomb, a 50 MB string, a FIFO or ``/dev/zero`` given as a
file, a JSON record nested thousands of levels deep, an override path hundreds of keys long) is
refused with one line before it can cost time or memory. The "Limits on input" table of
docs/rules-and-limits.md lists these values; ``benchmarks/fuzz_check.py --hostile`` measures that
each refusal takes well under a second.
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

#: Largest model ``config.json`` (``policy.model_name``'s); published ones are 1-60 KB. A MiB of JSON
#: parses in tens of milliseconds into at most a few tens of MB, whatever it holds.
MAX_MODEL_CONFIG_BYTES = 1 << 20
#: Most digits of an integer in any JSON the plugin reads (``jsonio``; CPython 3.11's own default for
#: ``int()``; 3.10 has none and converts a longer one in time growing with the square of its length).
MAX_INT_DIGITS = 4_300
#: The most of each attention-relevant number of a model (the least is 1). The published models stay
#: far below: 126 layers (Llama 3.1 405B), 128 heads, head dims of 576 (vLLM's MLA head), hidden
#: sizes of 18,432, 10.5 M positions (Llama 4 Scout), 262,144 tokens of vocabulary (Gemma 3).
MAX_MODEL_LAYERS = 1_024
MAX_ATTENTION_HEADS = 1_024
MAX_HEAD_DIM = 4_096
MAX_MODEL_WIDTH = 1 << 18
MAX_POSITIONS = 1 << 30
MAX_VOCAB_SIZE = 1 << 24
#: The model's attention-relevant integers, by name, and the most each may be (the least is 1): the
#: keys of a ``config.json`` the hosts' readings and the identity fields read (``text_config`` and
#: ``thinker_config.text_config`` alike), and the Megatron ``TransformerConfig`` attributes
#: ``policy.megatron_cfg.model_overrides`` may set. The layer count decides how many layers the
#: readings lay out; the others are bounded so that no arithmetic on them runs away.
MODEL_INTEGERS: dict[str, int] = {
    "num_hidden_layers": MAX_MODEL_LAYERS,
    "num_layers": MAX_MODEL_LAYERS,
    "num_attention_heads": MAX_ATTENTION_HEADS,
    "num_key_value_heads": MAX_ATTENTION_HEADS,
    "num_query_groups": MAX_ATTENTION_HEADS,
    "head_dim": MAX_HEAD_DIM,
    "kv_channels": MAX_HEAD_DIM,
    "qk_nope_head_dim": MAX_HEAD_DIM,
    "qk_head_dim": MAX_HEAD_DIM,
    "qk_rope_head_dim": MAX_HEAD_DIM,
    "qk_pos_emb_head_dim": MAX_HEAD_DIM,
    "v_head_dim": MAX_HEAD_DIM,
    "hidden_size": MAX_MODEL_WIDTH,
    "q_lora_rank": MAX_MODEL_WIDTH,
    "kv_lora_rank": MAX_MODEL_WIDTH,
    "sliding_window": MAX_POSITIONS,
    "max_position_embeddings": MAX_POSITIONS,
    "vocab_size": MAX_VOCAB_SIZE,
}
#: The model's attention-relevant real numbers and the open-closed range each must lie in.
MODEL_NUMBERS: dict[str, tuple[float, float]] = {
    "rope_theta": (0.0, 1e12),
    "partial_rotary_factor": (0.0, 1.0),
    "query_pre_attn_scalar": (0.0, 1e6),
    "attn_logit_softcapping": (0.0, 1e6),
}
#: Largest tokenizer file hashed in full for the tokenizer's identity (Gemma 3's ``tokenizer.json``
#: is 33 MB; sha256 reads about 1.5 GB/s here); of a larger one, this many bytes and its size.
MAX_TOKENIZER_HASH_BYTES = 64 << 20


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


def open_regular(path: os.PathLike[str] | str, what: str) -> tuple[int, os.stat_result]:
    """A file descriptor of the regular file ``path`` and its ``fstat``, opened without blocking (a
    FIFO never hangs); anything but a regular file is ``InputRefused`` (closed again), and the
    ``OSError`` of the open itself (missing, permission, symlink loop, name too long) propagates."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputRefused(f"{what} {shown_path(path)} is a {_kind(info.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_text(path: os.PathLike[str] | str, limit: int, what: str) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes.

    Refuses anything but a regular file (``open_regular``) and any file over ``limit`` before reading
    it; ``InputRefused`` (one line), ``OSError`` from the open itself and ``UnicodeDecodeError`` propagate."""
    fd, info = open_regular(path, what)
    try:
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


def kind_of(value: Any) -> str:
    """How an error line names the type of a parsed JSON or YAML value ("a boolean", "null", ...)."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list", dict: "a mapping"}
    return names.get(type(value), f"a {type(value).__name__}")


def integer_problem(value: Any, most: int, least: int = 1) -> str | None:
    """Why ``value`` is not an integer from ``least`` to ``most`` (None when it is): a boolean, a
    float such as 2.0, a string such as "2" are not integers."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is {kind_of(value)}, not an integer from {least} to {most}"
    return None if least <= value <= most else f"is not an integer from {least} to {most}"


def number_problem(value: Any, low: float, high: float) -> str | None:
    """Why ``value`` is not a finite number above ``low`` and at most ``high`` (None when it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {kind_of(value)}, not a number above {low:g} and at most {high:g}"
    return None if low < value <= high else f"is not a number above {low:g} and at most {high:g}"  # NaN fails


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
