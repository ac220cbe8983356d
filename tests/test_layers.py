"""The layers ARCHITECTURE.md documents hold: a module imports only its own layer and those below.

Layers, bottom up, one folder each: ``vocab`` (the stdlib-only words every layer uses), ``config``,
``model``, ``preflight``, ``contract``, ``kernels``, ``binding``, ``aligning``, ``report``, ``reference``,
``drift``, ``probe``, then ``hosts`` and ``cli`` (which may import everything). Imports inside functions
count as much as those at the top of a module; no upward import is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
LAYERS = (
    "vocab",
    "config",
    "model",
    "preflight",
    "contract",
    "kernels",
    "binding",
    "aligning",
    "report",
    "reference",
    "drift",
    "probe",
    "hosts",
    "cli",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int:
    """A module's layer: its package's place in ``LAYERS`` (top: the rest)."""
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nemo_rl_attn_align."):
            base = node.module.removeprefix("nemo_rl_attn_align.")
            found.add(base)
            found.update(
                f"{base}.{alias.name}"
                for alias in node.names
                if (PACKAGE / base / alias.name).exists() or (PACKAGE / base / f"{alias.name}.py").exists()
            )
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("nemo_rl_attn_align.")
                for a in node.names
                if a.name.startswith("nemo_rl_attn_align.")
            )
    return found


def _violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        for imported in sorted(_imports(path)):
            if (PACKAGE / imported).is_dir() and (PACKAGE / imported / "__init__.py").exists() and imported in LAYERS:
                continue  # ``from nemo_rl_attn_align.hosts import x``: judged by x
            if _rank(imported) > _rank(importer):
                out.append(f"{importer} imports {imported}")
    return out


def test_every_import_goes_down_or_sideways():
    assert _violations() == []


def test_every_module_is_in_a_layer():
    """No module outside the layers' folders (but the package's ``__init__`` and ``__main__``)."""
    loose = {_module_name(p) for p in PACKAGE.glob("*.py")} - {"", "__main__"}
    assert loose == set()


def test_an_upward_import_is_found(tmp_path):
    """The check itself: a config module importing binding (as settings.py once did) is a violation."""
    fake = tmp_path / "nemo_rl_attn_align"
    (fake / "config").mkdir(parents=True)
    (fake / "binding").mkdir()
    (fake / "config" / "settings.py").write_text("from nemo_rl_attn_align.binding.binding import Mandate\n")
    (fake / "binding" / "binding.py").write_text("from nemo_rl_attn_align.config.settings import x\n")
    globals()["PACKAGE"] = fake
    try:
        assert _violations() == ["config.settings imports binding.binding"]
    finally:
        globals()["PACKAGE"] = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"


def test_no_module_name_is_used_twice():
    """One home per idea: a module's file name says which (``__init__`` and ``__main__`` aside)."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem not in ("__init__", "__main__"):
            names.setdefault(path.stem, []).append(_module_name(path))
    assert {name: where for name, where in names.items() if len(where) > 1} == {}


#: The recipe's readers: the only modules that look values up in the raw config (``config_lookup``'s
#: lookups). ``check``, ``drift``, ``probe`` and the driver read what they build (``RecipeFacts``).
RECIPE_READERS = {
    "config.config_lookup",
    "preflight.facts",
    "preflight.generation_facts",
    "preflight.megatron_generation_facts",
    "preflight.recipe_facts",
}
LOOKUPS = {"section", "value_at", "get_or_unset"}


def _looks_up(path: Path) -> bool:
    """Whether a module imports one of ``LOOKUPS`` (or ``config_lookup`` itself, to call them through it)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "nemo_rl_attn_align.config.config_lookup":
            if LOOKUPS & {alias.name for alias in node.names}:
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "nemo_rl_attn_align.config":
            if "config_lookup" in {alias.name for alias in node.names}:
                return True
    return False


def test_only_the_recipe_readers_look_values_up_in_the_raw_config():
    """One reading of the recipe: no entry point goes back to its raw sections after the facts."""
    readers = {_module_name(path) for path in PACKAGE.rglob("*.py") if _looks_up(path)}
    assert readers <= RECIPE_READERS, sorted(readers - RECIPE_READERS)
    assert "preflight.facts" in readers  # the check sees the imports it looks for
