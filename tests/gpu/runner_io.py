"""The command line every GPU case runner shares: ``python -m tests.gpu.<runner> SPEC.json RESULT.json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(run: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str] | None = None) -> int:
    """Read the spec, ``run`` it, write the result (JSON); an exception escapes as a non-zero exit."""
    spec_path, result_path = sys.argv[1:] if argv is None else argv
    result = run(json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    return 0
