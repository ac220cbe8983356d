"""Regenerate the table of the engine arguments NeMo-RL's vLLM worker passes to vLLM itself.

    python scripts/update_vllm_worker_kwargs.py SNAPSHOTS MAIN_REF [REF ...]           # write the table
    python scripts/update_vllm_worker_kwargs.py SNAPSHOTS MAIN_REF [REF ...] --check   # exit 1 when it would change

SNAPSHOTS holds one unmodified NeMo-RL source tree per ref (``SNAPSHOTS/REF/nemo_rl``), the first
ref is NeMo-RL main. In each ref's ``nemo_rl/models/generation/vllm/vllm_worker.py`` it finds, with
``ast`` (nothing is imported), the one call ``dict(..., **vllm_kwargs)`` and records its keyword
names: a ``policy.generation.vllm_kwargs`` key among them reaches vLLM twice. For a keyword whose
value is a ``self.cfg[...]`` lookup it records that key of ``policy.generation`` (the worker's
``self.cfg``). The ref's version is ``nemo_rl/package_info.py``'s. The result replaces
``nemo_rl_attn_align/preflight/tables/vllm_worker_kwargs.json``; the nemo_rl lane runs ``--check``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkout_code import REPO  # first: the checkout's plugin, not an installed copy

# isort: split

from nemo_rl_attn_align.preflight import vllm_worker_kwargs
from nemo_rl_attn_align.vocab import jsonio

WORKER = Path("nemo_rl", "models", "generation", "vllm", "vllm_worker.py")
PACKAGE_INFO = Path("nemo_rl", "package_info.py")
SPREAD = "vllm_kwargs"


def _config_key(value: ast.expr) -> str | None:
    """``self.cfg["vllm_cfg"]["max_model_len"]`` -> ``vllm_cfg.max_model_len``; None for anything else."""
    parts: list[str] = []
    while isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
        parts.insert(0, str(value.slice.value))
        value = value.value
    is_cfg = isinstance(value, ast.Attribute) and value.attr == "cfg" and isinstance(value.value, ast.Name)
    return ".".join(parts) if is_cfg and parts and getattr(value.value, "id", None) == "self" else None


def passed_keys(source: str, where: str) -> dict[str, str | None]:
    """The keyword names of the one ``dict(..., **vllm_kwargs)`` call in ``source``."""
    calls = [
        node
        for node in ast.walk(ast.parse(source, filename=where))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == SPREAD for k in node.keywords)
    ]
    if len(calls) != 1:
        raise SystemExit(f"{where}: {len(calls)} calls dict(..., **{SPREAD}); expected one (the worker changed)")
    return {k.arg: _config_key(k.value) for k in sorted(calls[0].keywords, key=lambda k: k.arg or "") if k.arg}


def version_of(source: str, where: str) -> str:
    """``MAJOR.MINOR.PATCH`` + ``PRE_RELEASE`` of a ``package_info.py``, as NeMo-RL's ``__version__``."""
    found: dict[str, Any] = {}
    for node in ast.parse(source, filename=where).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    try:
        return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCH']}{found.get('PRE_RELEASE', '')}"
    except KeyError as err:
        raise SystemExit(f"{where}: no {err.args[0]} constant; expected NeMo-RL's package_info.py") from None


def generate(snapshots: Path, refs: list[str]) -> dict[str, Any]:
    """The table for ``refs`` (the first one main) of the trees under ``snapshots``."""
    entries = {}
    for ref in refs:
        tree = snapshots / ref
        worker, info = tree / WORKER, tree / PACKAGE_INFO
        entries[ref] = {
            "version": version_of(info.read_text(encoding="utf-8"), str(info)),
            "keys": passed_keys(worker.read_text(encoding="utf-8"), str(worker)),
        }
    return {"source": f"{WORKER.as_posix()}: dict(..., **{SPREAD})", "main": refs[0], "refs": entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", type=Path, help="the folder of NeMo-RL source trees, one per ref")
    parser.add_argument("refs", nargs="+", metavar="REF", help="the refs to read, NeMo-RL main first")
    parser.add_argument("--check", action="store_true", help="exit 1 when the table would change; write nothing")
    args = parser.parse_args(argv)
    new = generate(args.snapshots, args.refs)
    table = vllm_worker_kwargs.TABLE
    if args.check:
        stale = not table.is_file() or jsonio.loads(table.read_text(encoding="utf-8"), str(table)) != new
        print(f"{table.name} is {'stale' if stale else 'current'}")
        return int(stale)
    table.write_text(jsonio.dumps(new, indent=1) + "\n", encoding="utf-8")
    print(table.relative_to(REPO))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
