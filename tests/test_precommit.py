"""``.pre-commit-config.yaml`` is CI's lint step: ``.ci/run`` runs it, its hooks run the commands CI
ran before it (``ruff format --check``, ``ruff check``, ``mypy``) from the active environment, and
every tool it runs is pinned in the ``test`` extra."""

from __future__ import annotations

import re

import yaml

from .conftest import REPO

CONFIG = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
PYPROJECT = (REPO / "pyproject.toml").read_text()


def hooks() -> dict[str, dict]:
    return {hook["id"]: hook for repo in CONFIG["repos"] for hook in repo["hooks"]}


def test_ci_lints_through_pre_commit():
    assert "python -m pre_commit run --all-files" in (REPO / ".ci" / "run").read_text()


def test_the_hooks_run_the_ci_commands_with_the_environments_tools():
    assert [repo["repo"] for repo in CONFIG["repos"]] == ["local"]  # no download: the pinned tools
    found = hooks()
    assert set(found) == {"ruff-format", "ruff", "mypy"}
    assert found["ruff-format"]["entry"].startswith("python -m ruff format --check")  # never rewrites the tree
    assert found["ruff"]["entry"].startswith("python -m ruff check") and "--fix" not in found["ruff"]["entry"]
    assert found["mypy"]["entry"] == "python -m mypy" and found["mypy"]["pass_filenames"] is False  # [tool.mypy]
    assert all(hook["language"] == "system" for hook in found.values())


def test_every_tool_the_hooks_run_is_pinned_in_the_test_extra():
    test_extra = PYPROJECT[PYPROJECT.index("\ntest = [") :].split("\n]", 1)[0]  # up to its closing line
    pinned = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', test_extra))
    assert {"ruff", "mypy", "pre-commit"} <= set(pinned), pinned
