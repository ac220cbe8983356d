"""Size limits: no module of the package over 400 lines, no function over 60 (split along a real
seam instead: a new module for a new concern, a helper for a step with a name of its own)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _function_lengths(source: str, module: str) -> dict[str, int]:
    """``"module::Outer.inner"`` -> lines (``end_lineno - lineno + 1``) of every function in ``source``."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                assert child.end_lineno is not None
                lengths[f"{module}::{qualname}"] = child.end_lineno - child.lineno + 1
                visit(child, qualname + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=module), "")
    return lengths


def _module_lines() -> dict[str, int]:
    return {_name(path): len(path.read_text(encoding="utf-8").splitlines()) for path in _modules()}


def _all_function_lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for path in _modules():
        lengths.update(_function_lengths(path.read_text(encoding="utf-8"), _name(path)))
    return lengths


def _over_limit(sizes: dict[str, int], limit: int) -> list[str]:
    """Every entry over ``limit``."""
    return [f"{name}: {size} lines (limit {limit})" for name, size in sorted(sizes.items()) if size > limit]


def test_the_package_is_where_the_test_looks():
    assert (PACKAGE / "__init__.py").is_file()
    assert len(_modules()) > 50


def test_no_module_is_over_the_limit():
    over = _over_limit(_module_lines(), MAX_MODULE_LINES)
    assert not over, "split along a real seam:\n" + "\n".join(over)


def test_no_function_is_over_the_limit():
    over = _over_limit(_all_function_lengths(), MAX_FUNCTION_LINES)
    assert not over, "split along a real seam:\n" + "\n".join(over)


def test_the_limits_catch_an_oversized_entry():
    assert _over_limit({"a.py": 401, "b.py": 400}, MAX_MODULE_LINES) == ["a.py: 401 lines (limit 400)"]


def test_function_lengths_count_nested_functions_methods_and_decorated_bodies():
    source = (
        "def outer():\n"
        "    def inner():\n"
        "        pass\n"
        "    return inner\n"
        "\n"
        "\n"
        "class K:\n"
        "    @property\n"
        "    async def m(self):\n"
        "        pass\n"
    )
    assert _function_lengths(source, "sample.py") == {
        "sample.py::outer": 4,
        "sample.py::outer.inner": 2,
        "sample.py::K.m": 2,
    }
