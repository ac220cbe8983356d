"""The kernel tables: what the hosts' own selectors chose over a grid of recipes, generated, not written.

``scripts/update_kernel_tables.py`` runs Transformer Engine's ``get_attention_backend`` (the
``transformer-engine`` wheels named in the table, on declared GPUs, ``tests/real_te/stand_ins.py``)
and vLLM's CUDA selector (``tests/real_vllm/cuda_stand_ins.py``) on every cell of the grids below
and writes one file per host version (``tables/transformer_engine-2.14.1.json.xz``,
``tables/vllm-0.25.1.json.xz``, ...; only the version a query asks about is read); the lanes
regenerate them and fail when the committed files differ. ``check`` looks a recipe up here when the selector
cannot run in its own process. Each table names the versions it came from, what it declared and
what it held fixed; a query outside the grid gets no answer rather than a neighbour's.
Stdlib only.
"""

from __future__ import annotations

import array
import functools
import itertools
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.kernels.gpu import GPUS
from nemo_rl_attn_align.kernels.kernel_query import (
    FLASH_GENERATIONS,
    Kernel,
    RolloutQuery,
    TrainingQuery,
    flash_pin_switches,
)
from nemo_rl_attn_align.vocab import jsonio

TABLE_DIR = Path(__file__).with_name("tables")
SCHEMA = 5

#: Transformer Engine's rules tell head dims apart only by these bounds (flash-attn 2: a padded dim
#: <= 192 on some GPUs, <= 256, a multiple of 8; flash-attn 3: <= 256, the MLA pairs (128, 192] /
#: (96, 128]; cuDNN: <= 128, exactly 256 on Blackwell; flash-attn 4: exactly 512): one
#: representative of each class stands in the table, and the te lane checks that every dim of a
#: class gets its representative's answer. A pair of unequal dims other than MLA's has no class.
TRAINING_DIM_CLASSES = ((64, 64), (96, 96), (128, 128), (192, 192), (255, 224), (256, 256))
TRAINING_HEAD_DIMS = ("64/64", "96/96", "128/128", "192/192", "224/224", "256/256", "384/384", "512/512",
                      "100/100", "300/300", "192/128")  # fmt: skip
#: vLLM's backends name exact head sizes (FlashInfer 64/128/256/512, MLA 576, b12x 192) and bounds
#: (flash-attn: a multiple of 8, <= 256; Triton: >= 32); the vllm lane checks the classes likewise.
ROLLOUT_HEAD_SIZES = (16, 64, 80, 100, 128, 192, 256, 384, 512, 576, 640)
ROLLOUT_EXACT = (64, 128, 192, 256, 512, 576)
#: The backends vLLM's CUDA platform ranks (``vllm/platforms/cuda.py`` ``_get_backend_priorities``,
#: 0.25.1 to 0.34.0): what ``vllm_kwargs.attention_backend`` can force on an NVIDIA GPU. The vllm
#: lane checks that it names every backend those versions rank.
FORCEABLE = (
    "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT", "TRITON_FLASHINFER",
    "TRITON_FLASH_ATTN", "FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "CUTLASS_MLA",
    "TOKENSPEED_MLA", "FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHMLA_SPARSE",
    "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90", "FLASHINFER_MLA_SPARSE_SM120",
)  # fmt: skip


def training_head_dims(qk: int, v: int) -> str | None:
    """The table's class of a q/k and v head dim pair (None: a pair no class holds)."""
    if qk == v and qk % 8:
        return "100/100" if qk <= 256 else "300/300"
    if qk == v:
        if qk in (256, 512):
            return f"{qk}/{qk}"
        if qk > 256:
            return "384/384"
        rep = next(r for bound, r in TRAINING_DIM_CLASSES if qk <= bound)
        return f"{rep}/{rep}"
    if 128 < qk <= 192 and 96 < v <= 128 and not (qk % 8 or v % 8):
        return "192/128"
    return None


def rollout_head_size(size: int) -> int:
    """The table's class of a vLLM head size."""
    if size in ROLLOUT_EXACT:
        return size
    if size % 8:
        return 100 if size >= 32 else 16
    if size < 32:
        return 16
    return 80 if size <= 256 else 384 if size < 512 else 640


#: The training grid: one axis per TrainingQuery field the recipe fixes, in cell order.
TRAINING_AXES: tuple[tuple[str, tuple], ...] = (
    ("gpu", GPUS),
    ("backend", ("flash", "fused", "unfused", "auto")),
    ("dtype", ("bf16", "fp16", "fp32")),
    ("head_dims", TRAINING_HEAD_DIMS),
    ("window", (None, 1023)),
    ("softmax", ("vanilla", "off-by-one", "learnable")),
    ("cp_size", (1, 2)),
    ("qkv_format", ("sbhd", "thd")),
    ("deterministic", (False, True)),
    ("flash_attn_3", (False, True)),
    ("flash_pin", (None, *FLASH_GENERATIONS)),
)
#: What every training cell holds fixed (per tensor-parallel rank).
TRAINING_FIXED: dict[str, Any] = {"heads": 16, "kv_heads": 8, "seq_len": 4096, "batch_size": 2}

#: The rollout grid, in cell order.
ROLLOUT_AXES: tuple[tuple[str, tuple], ...] = (
    ("gpu", GPUS),
    ("dtype", ("bf16", "fp16", "fp32")),
    ("head_size", ROLLOUT_HEAD_SIZES),
    ("mla", ("none", "mla", "sparse")),
    ("kv_cache_dtype", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    ("sliding_window", (False, True)),
    ("has_sink", (False, True)),
    ("batch_invariant", (False, True)),
    ("forced_backend", (None, *FORCEABLE)),
    ("flash_attn_version", (None, *FLASH_GENERATIONS)),
)
ROLLOUT_FIXED: dict[str, Any] = {"heads": 16}

#: Each side's tables, one file per host version: ``tables/<prefix>-<version>.json.xz``.
PREFIXES = {"training": "transformer_engine", "rollout": "vllm"}


def training_queries() -> Iterator[TrainingQuery]:
    """Every training cell, in table order."""
    names = [name for name, _ in TRAINING_AXES]
    for values in itertools.product(*(axis for _, axis in TRAINING_AXES)):
        cell = dict(zip(names, values, strict=True))
        qk, v = (int(d) for d in cell.pop("head_dims").split("/"))
        pin = cell.pop("flash_pin")
        switches = flash_pin_switches(pin) if pin is not None else ()
        yield TrainingQuery(**cell, head_dim_qk=qk, head_dim_v=v, flash_switches=switches, **TRAINING_FIXED)


def rollout_queries() -> Iterator[RolloutQuery]:
    """Every rollout cell, in table order."""
    names = [name for name, _ in ROLLOUT_AXES]
    for values in itertools.product(*(axis for _, axis in ROLLOUT_AXES)):
        cell = dict(zip(names, values, strict=True))
        mla = cell.pop("mla")
        yield RolloutQuery(**cell, use_mla=mla != "none", use_sparse=mla == "sparse", **ROLLOUT_FIXED)


def _cell(axes: tuple[tuple[str, tuple], ...], values: Mapping[str, Any]) -> int | str:
    """The cell index of ``values`` (mixed radix over ``axes``), or why the grid has no such cell."""
    index = 0
    for name, axis in axes:
        value = values[name]
        if value not in axis:
            shown = ", ".join("none" if v is None else str(v) for v in axis)
            return f"{name}={value!r} is not in the generated table (it has {shown})"
        index = index * len(axis) + axis.index(value)
    return index


def training_cell(query: TrainingQuery) -> tuple[int | str, tuple[str, ...]]:
    """(cell index or why none, what the table assumes for this query)."""
    assumptions = [
        f"{TRAINING_FIXED['heads']} query / {TRAINING_FIXED['kv_heads']} KV heads per rank, "
        f"{TRAINING_FIXED['batch_size']} sequences of {TRAINING_FIXED['seq_len']} tokens, no dropout",
    ]
    if isinstance(query.flash_pin, str):
        return (
            f"NVTE_FLASH_ATTN_V2/_V3/_V4 ({query.flash_pin}) leave more than one flash-attn generation on; the table "
            "holds them unset or leaving one on",
            (),
        )
    values = {name: getattr(query, name) for name, _ in TRAINING_AXES}
    dims = training_head_dims(query.head_dim_qk, query.head_dim_v)
    if dims is None:
        return f"head dims {query.head_dims}: no class of the generated table holds this pair", ()
    if dims != query.head_dims:
        values["head_dims"] = dims
        assumptions.append(f"head dims {query.head_dims} as {dims} (TE's rules do not tell them apart)")
    if query.window is not None:
        values["window"] = 1023
        assumptions.append("any sliding window as a left window of 1023")
    if query.cp_size > 2:
        values["cp_size"] = 2
        assumptions.append(f"context parallel size {query.cp_size} as 2 (TE's filters test context_parallel)")
    return _cell(TRAINING_AXES, values), tuple(assumptions)


def rollout_cell(query: RolloutQuery) -> tuple[int | str, tuple[str, ...]]:
    """(cell index or why none, what the table assumes for this query)."""
    if query.forced_backend is not None and query.forced_backend not in FORCEABLE:
        return (
            f"vllm_kwargs.attention_backend={query.forced_backend!r} is not a backend vLLM's CUDA platform ranks "
            f"({', '.join(FORCEABLE)})",
            (),
        )
    values = {name: getattr(query, name) for name, _ in ROLLOUT_AXES}
    assumptions = [f"{ROLLOUT_FIXED['heads']} query heads"]
    size = rollout_head_size(query.head_size)
    if size != query.head_size:
        values["head_size"] = size
        assumptions.append(f"head size {query.head_size} as {size} (vLLM's backends do not tell them apart)")
    return _cell(ROLLOUT_AXES, values), tuple(assumptions)


@dataclass(frozen=True)
class Table:
    """One selector's generated table at one host version."""

    side: str
    host: str  # "Transformer Engine" or "vLLM"
    version: str
    header: Mapping[str, Any]
    results: tuple[tuple[Any, ...], ...]  # (kernel, version, reason ids, belief)
    reasons: tuple[str, ...]
    packed_cells: str  # ``_pack``'s hex, decoded on first use (only the version a query asks about)

    @functools.cached_property
    def cells(self) -> array.array:
        """The result index of every cell, in grid order."""
        return _unpack(self.packed_cells)

    @property
    def source(self) -> str:
        return f"{self.host} {self.version}'s own selector, from the table generated from it"

    def declared(self, omit: str | None = None) -> str:
        """The device-side facts the table was generated with, in one phrase (less those named ``omit...``)."""
        facts = self.header.get("declared", {}).items()
        return "declared " + ", ".join(f"{k} {v}" for k, v in facts if omit is None or not k.startswith(omit))

    def answer(self, cell: int, assumptions: tuple[str, ...], omit: str | None = None) -> Kernel:
        """The recorded answer of ``cell``; ``omit`` leaves declared facts this query did not use unsaid."""
        kernel, version, reason_ids, belief = self.results[self.cells[cell]]
        return Kernel(
            self.side,
            kernel,
            version,
            tuple(self.reasons[i] for i in reason_ids),
            self.source,
            (self.declared(omit), *assumptions),
            bool(belief),
        )


def _pack(cells: list[int]) -> str:
    """Cell -> result index, as the hex of little-endian uint16, compressed once with the file's xz (a
    list of ints parses 6x slower; base64 of zlib inside gzip, the former format, was 3x larger)."""
    packed = array.array("H", cells)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes().hex()


def _unpack(text: str) -> array.array:
    cells = array.array("H")
    cells.frombytes(bytes.fromhex(text))
    if sys.byteorder == "big":
        cells.byteswap()
    return cells


def encode(side: str, header: Mapping[str, Any], answers: list[Kernel]) -> dict[str, Any]:
    """The JSON form of one host version's table, answers in cell order (the generator's half)."""
    reasons: dict[str, int] = {}
    results: dict[tuple, int] = {}
    cells = []
    for answer in answers:
        ids = tuple(reasons.setdefault(r, len(reasons)) for r in answer.reasons)
        key = (answer.kernel, answer.version, ids, answer.belief)
        cells.append(results.setdefault(key, len(results)))
    axes = TRAINING_AXES if side == "training" else ROLLOUT_AXES
    return {
        **header,
        "axes": [[name, list(axis)] for name, axis in axes],
        "results": [[k, v, list(ids), b] for (k, v, ids, b) in results],
        "reasons": list(reasons),
        "cells": _pack(cells),
    }


def path(side: str, version: str, directory: Path = TABLE_DIR) -> Path:
    """The file of ``side``'s table at host ``version``."""
    return directory / f"{PREFIXES[side]}-{version}.json.xz"


def write(side: str, version: str, table: Mapping[str, Any], directory: Path = TABLE_DIR) -> Path:
    """Write one host version's encoded table, byte-for-byte reproducibly."""
    out_path = path(side, version, directory)
    import lzma

    text = jsonio.dumps({"schema": SCHEMA, "side": side, "version": version, "table": table}, sort_keys=True)
    out_path.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    return out_path


@functools.cache
def versions(side: str, directory: Path = TABLE_DIR) -> tuple[str, ...]:
    """The host versions ``side`` has a table file for (from the file names; nothing is parsed)."""
    prefix = f"{PREFIXES[side]}-"
    try:
        names = [p.name for p in directory.iterdir() if p.name.startswith(prefix) and p.name.endswith(".json.xz")]
    except OSError:
        return ()
    return tuple(sorted(name[len(prefix) : -len(".json.xz")] for name in names))


@functools.cache
def table(side: str, version: str, directory: Path = TABLE_DIR) -> Table | None:
    """``side``'s table at host ``version`` (None: no file, another schema, or another grid)."""
    import lzma  # here: check without a GPU to predict for reads no table

    file = path(side, version, directory)
    try:
        data = jsonio.loads(lzma.decompress(file.read_bytes()).decode("utf-8"), f"kernel table {file}")
    except (OSError, ValueError, lzma.LZMAError):
        return None
    axes = TRAINING_AXES if side == "training" else ROLLOUT_AXES
    encoded = data.get("table", {})
    if data.get("schema") != SCHEMA or encoded.get("axes") != [[name, list(axis)] for name, axis in axes]:
        return None  # generated by other code, or over another grid: not this code's to read
    header = {k: v for k, v in encoded.items() if k not in ("axes", "results", "reasons", "cells")}
    return Table(
        side,
        header.get("host", ""),
        version,
        header,
        tuple(tuple(r) for r in encoded["results"]),
        tuple(encoded["reasons"]),
        encoded["cells"],
    )


def load(side: str, directory: Path = TABLE_DIR) -> dict[str, Table]:
    """Every table of ``side`` that this code can read, by host version."""
    tables = {version: table(side, version, directory) for version in versions(side, directory)}
    return {version: t for version, t in tables.items() if t is not None}
