"""Size limits: no module of the package over 400 lines, no function over 60.

A module or function still over its limit is named below with its current size. An entry may not
grow (split the code instead), and an entry whose code is back under the limit fails until it is
removed, so the lists only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

#: Modules still over ``MAX_MODULE_LINES``: path inside the package -> its lines today.
OVERSIZED_MODULES: dict[str, int] = {
    "contract/rollout.py": 475,
}

#: Functions still over ``MAX_FUNCTION_LINES``: "path::qualified name" -> its lines today.
OVERSIZED_FUNCTIONS: dict[str, int] = {
    "contract/rollout.py::rollout_contract": 69,
}


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


def _over_limit(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> list[str]:
    """Every entry over ``limit`` that is not allowed, or allowed but grown past its recorded size."""
    return [
        f"{name}: {size} lines (limit {limit}" + (f", allowed {allowed[name]})" if name in allowed else ")")
        for name, size in sorted(sizes.items())
        if size > max(limit, allowed.get(name, 0))
    ]


def _stale(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> list[str]:
    """Allowed entries that no longer exist or are back within ``limit``: remove them."""
    return [
        f"{name}: {sizes[name]} lines, within {limit}" if name in sizes else f"{name}: not found"
        for name in sorted(allowed)
        if sizes.get(name, 0) <= limit
    ]


def test_the_package_is_where_the_test_looks():
    assert (PACKAGE / "__init__.py").is_file()
    assert len(_modules()) > 50


def test_no_module_is_over_the_limit():
    over = _over_limit(_module_lines(), MAX_MODULE_LINES, OVERSIZED_MODULES)
    assert not over, "split along a real seam:\n" + "\n".join(over)


def test_no_function_is_over_the_limit():
    over = _over_limit(_all_function_lengths(), MAX_FUNCTION_LINES, OVERSIZED_FUNCTIONS)
    assert not over, "split along a real seam:\n" + "\n".join(over)


@pytest.mark.parametrize(
    ("sizes", "limit", "allowed"),
    [
        pytest.param(_module_lines, MAX_MODULE_LINES, OVERSIZED_MODULES, id="modules"),
        pytest.param(_all_function_lengths, MAX_FUNCTION_LINES, OVERSIZED_FUNCTIONS, id="functions"),
    ],
)
def test_the_allow_lists_only_shrink(sizes, limit, allowed):
    stale = _stale(sizes(), limit, allowed)
    assert not stale, "remove from the allow-list:\n" + "\n".join(stale)


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
