"""No import cycles among the plugin's modules, read statically from the source.

Every ``import`` / ``from ... import`` statement counts, wherever it stands: at module level, inside a
function (the lazy imports that keep ``check`` and the worker path light) and under
``if TYPE_CHECKING:``. ``from package import name`` is an edge to ``package.name`` when that is a
module, else to ``package``. Modules chosen by a computed name (``importlib.import_module``: the
CLI's sub-commands, the bootstrap's hosts) are registries by name and are not import statements.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import REPO

PACKAGE = "nemo_rl_attn_align"


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, by any import statement."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_scan_sees_every_kind_of_import(tmp_path):
    """A planted cycle through a function-level import and a TYPE_CHECKING import is found."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from nemo_rl_attn_align.sub import b\n")
    (package / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import c\n")
    (package / "c.py").write_text("import nemo_rl_attn_align.a as a\n")
    (package / "d.py").write_text("from nemo_rl_attn_align import a\n")  # into the cycle, not part of it
    graph = import_graph(tmp_path)
    assert graph["nemo_rl_attn_align.sub.b"] == {"nemo_rl_attn_align.c"}
    assert cycles(graph) == [["nemo_rl_attn_align.a", "nemo_rl_attn_align.c", "nemo_rl_attn_align.sub.b"]]


def test_no_import_cycles_among_the_plugins_modules():
    graph = import_graph()
    assert {"nemo_rl_attn_align.binding.binding", "nemo_rl_attn_align.hosts.bootstrap"} <= graph.keys()
    assert "nemo_rl_attn_align.vocab.codes" in graph["nemo_rl_attn_align.binding.determinism"]
    assert cycles(graph) == []
