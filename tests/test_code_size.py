"""Size limits: no module of the package over 400 lines, no function over 60 (split along a real
seam instead: a new module for a new concern, a helper for a step with a name of its own), no
function with more than six parameters (a frozen dataclass that names the idea instead; the
constructors dataclasses generate are not in the source, so they are not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6
#: Modules another change of issue #31 reduces; removed from here once it is merged.
PARAMETERS_PENDING: tuple[str, ...] = ()


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(source: str, module: str) -> dict[str, tuple[Function, bool]]:
    """``"module::Outer.inner"`` -> (every function in ``source``, whether it is a method)."""
    functions: dict[str, tuple[Function, bool]] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                functions[f"{module}::{qualname}"] = (child, in_class)
                visit(child, qualname + ".", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", True)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(source, filename=module), "", False)
    return functions


def _function_lengths(source: str, module: str) -> dict[str, int]:
    """``"module::Outer.inner"`` -> lines (``end_lineno - lineno + 1``) of every function in ``source``."""
    lengths = {}
    for name, (node, _) in _functions(source, module).items():
        assert node.end_lineno is not None
        lengths[name] = node.end_lineno - node.lineno + 1
    return lengths


def _parameter_counts(source: str, module: str) -> dict[str, int]:
    """``"module::Outer.inner"`` -> parameters of every function in ``source`` (``*args`` and
    ``**kwargs`` one each; a method's ``self`` or ``cls`` not counted)."""
    counts = {}
    for name, (node, method) in _functions(source, module).items():
        args = node.args
        named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        bound = method and bool(named) and named[0].arg in ("self", "cls")
        counts[name] = len(named) - bound + (args.vararg is not None) + (args.kwarg is not None)
    return counts


def _module_lines() -> dict[str, int]:
    return {_name(path): len(path.read_text(encoding="utf-8").splitlines()) for path in _modules()}


def _all_function_lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for path in _modules():
        lengths.update(_function_lengths(path.read_text(encoding="utf-8"), _name(path)))
    return lengths


def _all_parameter_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in _modules():
        if _name(path) not in PARAMETERS_PENDING:
            counts.update(_parameter_counts(path.read_text(encoding="utf-8"), _name(path)))
    return counts


def _over_limit(sizes: dict[str, int], limit: int, unit: str = "lines") -> list[str]:
    """Every entry over ``limit``."""
    return [f"{name}: {size} {unit} (limit {limit})" for name, size in sorted(sizes.items()) if size > limit]


def test_the_package_is_where_the_test_looks():
    assert (PACKAGE / "__init__.py").is_file()
    assert len(_modules()) > 50


def test_no_module_is_over_the_limit():
    over = _over_limit(_module_lines(), MAX_MODULE_LINES)
    assert not over, "split along a real seam:\n" + "\n".join(over)


def test_no_function_is_over_the_limit():
    over = _over_limit(_all_function_lengths(), MAX_FUNCTION_LINES)
    assert not over, "split along a real seam:\n" + "\n".join(over)


def test_no_function_takes_more_than_six_parameters():
    over = _over_limit(_all_parameter_counts(), MAX_PARAMETERS, "parameters")
    assert not over, "pass a frozen dataclass that names the idea:\n" + "\n".join(over)


def test_the_pending_modules_exist():
    assert all((PACKAGE / name).is_file() for name in PARAMETERS_PENDING)


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


def test_parameter_counts_leave_out_self_and_cls_and_count_star_arguments():
    source = (
        "def plain(a, b, /, c, *, d):\n"
        "    pass\n"
        "\n"
        "\n"
        "def star(a, *args, b, **kwargs):\n"
        "    def inner(self, x):\n"
        "        pass\n"
        "\n"
        "\n"
        "class K:\n"
        "    def m(self, a):\n"
        "        pass\n"
        "\n"
        "    @classmethod\n"
        "    def c(cls):\n"
        "        pass\n"
        "\n"
        "    @staticmethod\n"
        "    def s(ctx, a):\n"
        "        pass\n"
    )
    assert _parameter_counts(source, "sample.py") == {
        "sample.py::plain": 4,
        "sample.py::star": 4,
        "sample.py::star.inner": 2,
        "sample.py::K.m": 1,
        "sample.py::K.c": 0,
        "sample.py::K.s": 2,
    }


def test_the_parameter_limit_catches_a_function_with_seven():
    source = (
        "def seven(a, b, c, d, e, f, *, g=None):\n"
        "    pass\n"
        "\n"
        "\n"
        "class K:\n"
        "    def six(self, a, b, c, d, e, f):\n"
        "        pass\n"
    )
    counts = _parameter_counts(source, "sample.py")
    assert _over_limit(counts, MAX_PARAMETERS, "parameters") == ["sample.py::seven: 7 parameters (limit 6)"]
