"""Docstrings and comments name code where it lives: a ``module.name`` (``facts.read_recipe_facts``,
``preflight.recipe_facts.RecipeFacts``, ``Class.member``) whose leading part names a module of the
package must name something that module defines (read from its source, nothing imported)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_rl_attn_align"
#: ``name.name`` in backquotes, optionally called: ``a.b``, ``a.b.c()``.
DOTTED = re.compile(r"`+([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`+")
#: Spelled like a module's name, but a value, a key or a file: a variable's attribute (``settings``,
#: ``plan``, ``mandate``, ``run``, ``alignment``), a report key (``drift.steps``), a host's setting.
NOT_CODE = {
    "alignment.changes",
    "config.json",
    "drift.attention_only",
    "drift.steps",
    "kernel_pair.one_generation",
    "mandate.dtype",
    "model_config.tokenizer",
    "plan.gpu",
    "run.run_id",
    "settings.preset",
    "settings.report_dir",
    "settings.strict",
}
FILE_SUFFIXES = ("json", "md", "pth", "py", "yaml")


def _defined(tree: ast.Module) -> dict[str, set[str] | None]:
    """Top-level name -> the names its class body defines (None: not a class of this module)."""
    names: dict[str, set[str] | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                members |= {n.id for n in ast.walk(item) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
            names[node.name] = members
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(alias.asname or alias.name).split(".")[0]: None for alias in node.names})
        else:
            names.update(
                {n.id: None for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            )
    return names


def _modules() -> dict[str, dict[str, set[str] | None]]:
    """Every dotted tail of every module's name (``preflight.facts``, ``facts``) -> what it defines;
    a package also defines its submodules."""
    full: dict[str, dict[str, set[str] | None]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        full[".".join(parts)] = _defined(ast.parse(path.read_text(encoding="utf-8")))
    for name in list(full):
        package, _, child = name.rpartition(".")
        if package in full:
            full[package][child] = None
    tails: dict[str, dict[str, set[str] | None]] = {}
    for name, defined in full.items():
        words = name.split(".")
        for i in range(len(words)):
            tails.setdefault(".".join(words[i:]), {}).update(defined)
    return tails


def unresolved(dotted: str, modules: dict[str, dict[str, set[str] | None]]) -> bool:
    """Whether ``dotted`` names a module of the package and then something it does not define."""
    parts = dotted.split(".")
    if dotted in NOT_CODE or parts[-1] in FILE_SUFFIXES:
        return False
    for i in range(len(parts), 0, -1):
        defined = modules.get(".".join(parts[:i]))
        if defined is None:
            continue
        rest = parts[i:]
        if not rest:
            return False
        if rest[0] not in defined:
            return True
        members = defined[rest[0]]
        return len(rest) > 1 and members is not None and rest[1] not in members
    return False


def _texts(source: str) -> list[tuple[int, str]]:
    """Every string constant and comment of ``source``, with its line."""
    texts = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    texts += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return texts


def test_every_dotted_name_in_a_docstring_or_comment_resolves():
    modules = _modules()
    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _texts(path.read_text(encoding="utf-8")):
            stale += [
                f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(1)}"
                for match in DOTTED.finditer(text)
                if unresolved(match.group(1), modules)
            ]
    assert stale == [], "name where it lives now:\n" + "\n".join(stale)


def test_a_name_in_a_module_it_moved_out_of_is_caught():
    modules = _modules()
    assert unresolved("facts.read_recipe_facts", modules)
    assert unresolved("preflight.facts.RecipeFacts", modules)
    assert unresolved("recipe_facts.RecipeFacts.no_such_field", modules)
    assert not unresolved("recipe_facts.read_recipe_facts", modules)
    assert not unresolved("preflight.recipe_facts.RecipeFacts.policy", modules)
    assert not unresolved("config.loader.load_config", modules)
    assert not unresolved("policy.megatron_cfg", modules)  # a config key: no module of that name
