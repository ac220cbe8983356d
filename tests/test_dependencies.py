"""The package uses its dependencies through their public API only (issue #40, item 7): no import
names a private module or name of a third-party package (``omegaconf._utils.get_yaml_loader`` moved in
OmegaConf 2.4 and ``check`` exited 2 there). The declared ranges are tested at both ends by
``.ci/lanes/dependency_range.sh``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
REPO = PACKAGE.parent


def _imported_names(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node.lineno, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]


def test_no_private_import_of_another_package():
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, names in _imported_names(ast.parse(path.read_text(encoding="utf-8"))):
            for name in names:
                top = name.split(".")[0]
                if top in ("nemo_rl_attn_align", "__future__") or top in sys.stdlib_module_names:
                    continue
                if any(part.startswith("_") for part in name.split(".")):
                    private.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert private == []


def test_the_range_lane_reads_the_declared_dependencies():
    lane = (REPO / ".ci" / "lanes" / "dependency_range.sh").read_text(encoding="utf-8")
    assert '["project"]["dependencies"]' in lane and "pip check" in lane
    assert "find_python 3.10" in lane and "find_python 3.13" in lane
    assert 'requires-python = ">=3.10,<3.14"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
