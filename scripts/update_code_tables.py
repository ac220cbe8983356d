"""Rewrite the code tables of docs/rules-and-limits.md and docs/report-schema.md from ``vocab.codes``.

Each table stands between ``<!-- codes:NAME -->`` and ``<!-- /codes:NAME -->``. Run it after adding or
changing a code (the tests fail while a table differs from the registry)::

    python scripts/update_code_tables.py          # rewrite the tables in place
    python scripts/update_code_tables.py --check  # exit 1 naming each file whose table differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a checkout that is not installed

from nemo_rl_attn_align.vocab import codes  # noqa: E402
from nemo_rl_attn_align.vocab.codes import Kind, markdown_table  # noqa: E402

#: Table name -> (the kinds of code it lists, its last column's header).
TABLES = {
    "rule": ((Kind.RULE, Kind.KERNEL), "what it catches"),
    # every code a run report (or ``check``'s preview of it) carries
    "report": ((Kind.BINDING, Kind.DETERMINISM, Kind.REPORT, Kind.HOST, Kind.PRESET), "meaning"),
}
#: File (relative to the repository) -> the tables it holds.
FILES = {"docs/rules-and-limits.md": ("rule",), "docs/report-schema.md": ("report",)}


def table(name: str) -> str:
    """The markdown of table ``name`` as the registry gives it."""
    kinds, header = TABLES[name]
    return markdown_table(*kinds, header=header)


def updated(text: str, names: tuple[str, ...]) -> str:
    """``text`` with each table of ``names`` rewritten between its markers (each must occur once)."""
    for name in names:
        pattern = re.compile(rf"(<!-- codes:{name} -->\n).*?(<!-- /codes:{name} -->)", re.S)
        if len(pattern.findall(text)) != 1:
            raise ValueError(f"expected one <!-- codes:{name} --> ... <!-- /codes:{name} --> pair")
        text = pattern.sub(lambda m, name=name: m.group(1) + table(name) + m.group(2), text)
    return text


def stale(root: Path = REPO) -> list[str]:
    """The files under ``root`` whose tables differ from the registry."""
    return [
        name
        for name, tables in FILES.items()
        if updated((root / name).read_text(), tables) != (root / name).read_text()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    args = parser.parse_args(argv)
    if Path(codes.__file__).resolve().parents[2] != REPO:
        print(
            f"imports nemo_rl_attn_align from {Path(codes.__file__).parent}, not from {REPO}; "
            f"run it with PYTHONPATH={REPO}",
            file=sys.stderr,
        )
        return 2
    differ = stale()
    if args.check:
        for name in differ:
            print(
                f"{name}: a code table differs from nemo_rl_attn_align/vocab/codes.py; "
                "run python scripts/update_code_tables.py",
                file=sys.stderr,
            )
        return 1 if differ else 0
    for name in differ:
        path = REPO / name
        path.write_text(updated(path.read_text(), FILES[name]))
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
