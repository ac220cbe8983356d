"""Did-you-mean suggestions for values that must be one of a fixed set of names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def did_you_mean(value: str, choices: Sequence[str], aliases: Mapping[str, str] | None = None) -> str | None:
    """The valid name ``value`` most likely meant (case, spacing, a known alias, a prefix, a typo), or None."""
    lowered = value.strip().lower()
    if aliases and lowered in aliases:
        return aliases[lowered]
    for name in choices:
        if (
            lowered == name.lower()
            or lowered.startswith(name.lower())
            or (len(lowered) >= 3 and name.lower().startswith(lowered))
        ):
            return name
    import difflib  # here: only a misspelt value needs it

    close = difflib.get_close_matches(lowered, [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return None
    return next(c for c in choices if c.lower() == close[0])


def describe_invalid(value: Any, choices: Sequence[str], aliases: Mapping[str, str] | None = None) -> str:
    """Why ``value`` is not one of ``choices``: the valid names and, where one fits, a did-you-mean."""
    valid = ", ".join(choices)
    if not isinstance(value, str):
        shown = "null" if value is None else type(value).__name__
        return f"must be one of the strings {valid}, not {shown}"
    if value.strip() == "":
        return f"is empty; valid names: {valid}"
    suggestion = did_you_mean(value, choices, aliases)
    hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
    return f"is not a valid name{hint}; valid names (exact spelling): {valid}"
