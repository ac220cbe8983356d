"""Hostile model directories for ``check`` (issue #40): a ``config.json`` with random values, types,
sizes and depths, or one that is not a file at all; tokenizer files missing, unreadable, huge or
sparse; a Hugging Face cache with broken refs and blobs; recipe overrides of the model's values.

``write_cases(root, count, seed)`` writes ``count`` cases under ``root`` (a directory each; the
cache layout under ``root / "hub"``, which ``HF_HUB_CACHE`` must name), each a ``ModelCase``: the
overrides that point ``check`` at it and why the input is unusable (None: usable). Whether a value
is usable is decided here by the limits docs/rules-and-limits.md's "Limits on input" table states (each pool
below holds its valid and its invalid values by construction), not by the plugin's reader.
``tests/test_hostile_model_files.py`` runs a sample through the real CLI;
``benchmarks/hostile_models.py`` runs ten thousand and prints the worst time and memory.

A file of mode 000 is unreadable only to a process without CAP_DAC_OVERRIDE:
``without_file_permission_override`` drops it (and CAP_DAC_READ_SEARCH) where the runner is root.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.vocab.limits import (
    MAX_ATTENTION_HEADS,
    MAX_HEAD_DIM,
    MAX_INT_DIGITS,
    MAX_MODEL_CONFIG_BYTES,
    MAX_MODEL_LAYERS,
    MAX_MODEL_WIDTH,
    MAX_NESTING,
    MAX_POSITIONS,
    MAX_VOCAB_SIZE,
)

from .hostile_inputs import hydra_literal

#: Small configs of architectures the architecture table reads (one per kind of attention layout).
_FULL = ["full_attention"] * 4
BASES: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
                         "num_hidden_layers": 4, "sliding_window": None, "use_sliding_window": False},
    "LlamaForCausalLM": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 32,
                         "num_hidden_layers": 4, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    "GptOssForCausalLM": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                          "num_hidden_layers": 4, "sliding_window": 128,
                          "layer_types": ["sliding_attention", "full_attention"] * 2},
    "DeepseekV3ForCausalLM": {"hidden_size": 512, "num_attention_heads": 16, "num_key_value_heads": 16,
                              "num_hidden_layers": 4, "kv_lora_rank": 512, "q_lora_rank": 1536,
                              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 64},
    "NemotronHForCausalLM": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
                             "hybrid_override_pattern": "M*M-M*"},
    "Gemma3ForCausalLM": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
                          "num_hidden_layers": 4, "sliding_window": 512, "query_pre_attn_scalar": 64,
                          "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                                          "full_attention"]},
    "Qwen3NextForCausalLM": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
                             "head_dim": 64, "num_hidden_layers": 4,
                             "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
    "Qwen2_5_VLForConditionalGeneration": {"text_config": {"hidden_size": 256, "num_attention_heads": 8,
                                                           "num_key_value_heads": 2, "num_hidden_layers": 4,
                                                           "layer_types": _FULL}},
}  # fmt: skip
_COMMON = {"vocab_size": 1000, "max_position_embeddings": 4096, "rope_theta": 10000.0, "torch_dtype": "bfloat16"}

#: Values that are usable nowhere a limit applies (each names what it is, for the case's label).
_NOT_A_NUMBER: list[Any] = ["28", "", True, False, [], {}, [4], {"a": 1}]
_REAL = [2.5, 1.0, 1e8, float("inf"), float("-inf"), float("nan")]


def _integer_pools(most: int, required: bool) -> tuple[list[Any], list[Any]]:
    """(valid, invalid) values of an integer from 1 to ``most`` (null valid unless ``required``)."""
    valid = [1, 2, 3, 7, most // 2 or 1, most, *([] if required else [None])]
    invalid = [0, -1, -(10**30), most + 1, *[n for n in (10**8, 10**30) if n > most], *_REAL, *_NOT_A_NUMBER]
    return valid, invalid + ([None] if required else [])


#: Each limited key of a config.json (documented in docs/rules-and-limits.md), and its (valid, invalid) values.
POOLS: dict[str, tuple[list[Any], list[Any]]] = {
    "num_hidden_layers": _integer_pools(MAX_MODEL_LAYERS, required=True),
    "num_attention_heads": _integer_pools(MAX_ATTENTION_HEADS, required=True),
    "hidden_size": _integer_pools(MAX_MODEL_WIDTH, required=True),
    "num_key_value_heads": _integer_pools(MAX_ATTENTION_HEADS, required=False),
    "head_dim": _integer_pools(MAX_HEAD_DIM, required=False),
    "qk_nope_head_dim": _integer_pools(MAX_HEAD_DIM, required=False),
    "qk_rope_head_dim": _integer_pools(MAX_HEAD_DIM, required=False),
    "v_head_dim": _integer_pools(MAX_HEAD_DIM, required=False),
    "kv_lora_rank": _integer_pools(MAX_MODEL_WIDTH, required=False),
    "q_lora_rank": _integer_pools(MAX_MODEL_WIDTH, required=False),
    "sliding_window": _integer_pools(MAX_POSITIONS, required=False),
    "max_position_embeddings": _integer_pools(MAX_POSITIONS, required=False),
    "vocab_size": _integer_pools(MAX_VOCAB_SIZE, required=False),
    "rope_theta": ([1.0, 10000, 5e5, 1e12, None], [0, -1.0, 1e13, *_REAL[3:], *_NOT_A_NUMBER]),
    "partial_rotary_factor": ([0.25, 0.5, 1, None], [0, -0.5, 1.5, *_REAL[3:], *_NOT_A_NUMBER]),
    "query_pre_attn_scalar": ([1, 64, 256.0, None], [0, -64, 1e7, *_REAL[3:], *_NOT_A_NUMBER]),
    "attn_logit_softcapping": ([50.0, 30, None], [0, -1.0, 1e9, *_REAL[3:], *_NOT_A_NUMBER]),
    "layer_types": (
        [["full_attention"], ["sliding_attention", "full_attention"] * 2, ["bogus"] * 3, [], "full", None],
        [["full_attention"] * (MAX_MODEL_LAYERS + 1), 7, {}, True, 2.5],
    ),
    "hybrid_override_pattern": (
        ["M*M", "*", "", "M" * 40 + "*", "M*/M", ["M", "*"], [], None],
        ["*" * (MAX_MODEL_LAYERS + 1), 5, {}, 2.5],
    ),
    "use_sliding_window": ([True, False, None], ["false", "yes", 0, 1, [], {}]),
    "rope_scaling": ([{}, {"rope_type": "linear", "factor": 2.0}, {"type": [1]}, None], [[], "linear", 5, True]),
    "rope_parameters": ([{"rope_type": "default", "rope_theta": 1e6}, {}, None], [[1], "x", 3.0]),
}
#: Keys no limit applies to: any value (odd ones included) leaves the config usable.
FREE_VALUES: list[Any] = [
    None, True, -1, 0, 10**40, 2.5, float("nan"), float("inf"), "x" * 5000, "\u2028\u0000\n", [], {}, [[[1]]],
    {"a": {"b": {"c": [None]}}}, int("9" * MAX_INT_DIGITS),
]  # fmt: skip


@dataclass
class ModelCase:
    """One hostile model: its label, the overrides pointing ``check`` at it, and why it is unusable
    (None: usable, so ``check`` exits 0 or 1); ``mode_000`` when it holds a file of mode 000."""

    label: str
    overrides: list[str]
    unusable: str | None
    mode_000: bool = False


def base_config(architecture: str) -> dict[str, Any]:
    """A usable config.json of ``architecture`` (``BASES``)."""
    config = {"architectures": [architecture], **copy.deepcopy(_COMMON), **copy.deepcopy(BASES[architecture])}
    if "text_config" in config:
        config["text_config"].update(copy.deepcopy(_COMMON))
    return config


def _text_part(config: dict[str, Any]) -> dict[str, Any]:
    """The mapping holding the text model's values (``text_config`` for a multimodal model)."""
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk space (a hole, then one byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.seek(size - 1)
        handle.write(b"}")


def _dump(config: Any) -> str:
    return json.dumps(config)  # NaN and Infinity as Python's json (and transformers') writes them


# --- the families: each writes one case into ``folder`` -----------------------------------------


def _values(rng: random.Random, folder: Path) -> tuple[str, str | None]:
    """A base config with one to three limited keys (where the text model keeps them) changed."""
    architecture = rng.choice(sorted(BASES))
    config = base_config(architecture)
    text = _text_part(config)
    unusable, labels = None, []
    for key in rng.sample(sorted(POOLS), rng.choice((1, 1, 2, 3))):
        valid, invalid = POOLS[key]
        bad = rng.random() < 0.6
        value = copy.deepcopy(rng.choice(invalid if bad else valid))
        where = text
        if key == "rope_theta" and rng.random() < 0.3 and isinstance(config.setdefault("rope_parameters", {}), dict):
            where = config["rope_parameters"]  # transformers 5 keeps it there
        where[key] = value
        labels.append(f"{key}={value!r}"[:60])
        unusable = unusable or (f"{key} breaks its limit" if bad else None)
    if rng.random() < 0.3:  # an unlimited key with an odd value never matters
        text[f"extra_{rng.randrange(99)}"] = copy.deepcopy(rng.choice(FREE_VALUES))
    _write(folder / "config.json", _dump(config))
    return f"values {architecture}: {', '.join(labels)}", unusable


def _structure(rng: random.Random, folder: Path) -> tuple[str, str | None]:
    """A config.json of a hostile shape: too deep, not an object, not JSON, too large, long numbers."""
    config = base_config(rng.choice(sorted(BASES)))
    kind = rng.choice(("deep", "shallow", "top", "broken", "utf8", "large", "sparse", "keys", "digits", "empty"))
    path = folder / "config.json"
    if kind in ("deep", "shallow"):
        depth = rng.choice((MAX_NESTING, 40, 1000, 100_000)) if kind == "deep" else rng.randrange(1, MAX_NESTING)
        config["quantization_config"] = json.loads("[" * depth + "]" * depth) if depth < 500 else None
        text = _dump(config)
        if depth >= 500:
            text = text.replace('"quantization_config": null', '"quantization_config": ' + "[" * depth + "]" * depth)
        _write(path, text)
        return f"structure: nested {depth + 1} deep", "nested too deep" if kind == "deep" else None
    if kind == "top":
        text = rng.choice(("[]", "5", '"x"', "null", "true", "[" + _dump(config) + "]"))
        _write(path, text)
        return f"structure: top level {text[:20]}", "not a JSON object"
    if kind == "broken":
        whole = _dump(config)
        text = rng.choice((whole[: rng.randrange(1, len(whole) - 1)], "{'a': 1}", "{,}", "\ufeff" + whole, "{]", "NaN"))
        _write(path, text)
        return f"structure: not JSON {text[:20]!r}", "not JSON"
    if kind == "utf8":
        _write(path, _dump(config).encode()[:-1] + b'\xff"}')
        return "structure: invalid UTF-8", "not UTF-8"
    if kind in ("large", "sparse"):
        size = rng.choice((MAX_MODEL_CONFIG_BYTES + 1, 4 << 20, 2 << 30))
        if kind == "sparse":
            _sparse(path, size)
        else:
            config["padding"] = "x" * (MAX_MODEL_CONFIG_BYTES + 1)
            _write(path, _dump(config))
        return f"structure: {kind} file of {size} bytes", "over the size limit"
    if kind == "keys":  # many keys and a long string, within the size limit
        config.update({f"k{i}": i for i in range(rng.choice((1000, 30_000)))})
        config["note"] = "y" * rng.randrange(100_000)
        _write(path, _dump(config))
        return "structure: many keys within the size limit", None
    if kind == "digits":
        digits = rng.choice((MAX_INT_DIGITS, MAX_INT_DIGITS + 1, 100_000))
        _write(path, _dump(config)[:-1] + ', "pad_token_id": ' + "7" * digits + "}")
        return f"structure: an integer of {digits} digits", None if digits <= MAX_INT_DIGITS else "too many digits"
    _write(path, "")
    return "structure: empty file", "not JSON"


def _file_kind(rng: random.Random, folder: Path) -> tuple[str, str | None]:
    """config.json as something that is not a readable regular file (or not there at all)."""
    path = folder / "config.json"
    folder.mkdir(parents=True, exist_ok=True)
    kind = rng.choice(("missing", "no folder", "directory", "fifo", "device", "dangling", "loop", "socket", "mode 000"))
    if kind == "missing":
        return "file: no config.json in the folder", None
    if kind == "no folder":
        folder.rmdir()
        return "file: the folder does not exist", None
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(folder / "nowhere.json")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "socket":
        _unix_socket(path)
    else:
        _write(path, _dump(base_config("Qwen2ForCausalLM")))
        path.chmod(0)
    return f"file: config.json is a {kind}", f"a {kind}"


def _unix_socket(path: Path) -> None:
    """A socket file at ``path`` (bound, then closed: the file stays)."""
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
    finally:
        server.close()


_TOKENIZER_KINDS = (
    "none", "small", "mode 000", "fifo", "directory", "dangling", "device", "sparse 2 GiB", "sparse 65 MiB",
    "merges mode 000", "cache blob", "cache blob dangling",
)  # fmt: skip


def _tokenizer(rng: random.Random, folder: Path) -> tuple[str, str | None, list[str]]:
    """A usable config.json with tokenizer files of one hostile kind; the extra overrides it needs."""
    _write(folder / "config.json", _dump(base_config(rng.choice(sorted(BASES)))))
    kind = rng.choice(_TOKENIZER_KINDS)
    tokenizer = folder / "tokenizer.json"
    usable, overrides = kind in ("none", "small", "sparse 2 GiB", "sparse 65 MiB", "cache blob"), []
    if kind == "small":
        _write(tokenizer, '{"model": {"vocab": {"a": 0}}}')
    elif kind == "mode 000":
        _write(tokenizer, "{}")
        tokenizer.chmod(0)
    elif kind == "fifo":
        os.mkfifo(tokenizer)
    elif kind == "directory":
        tokenizer.mkdir()
    elif kind == "dangling":
        tokenizer.symlink_to(folder / "gone.json")
    elif kind == "device":
        tokenizer.symlink_to("/dev/zero")
    elif kind.startswith("sparse"):
        _sparse(tokenizer, 2 << 30 if "GiB" in kind else 65 << 20)
    elif kind == "merges mode 000":
        _write(folder / "vocab.json", '{"a": 0}')
        _write(folder / "merges.txt", "a b\n")
        (folder / "merges.txt").chmod(0)
    elif kind.startswith("cache blob"):  # the hub cache's layout: snapshots/<rev>/tokenizer.json -> blobs/<sha256>
        blob = folder / "blobs" / f"{rng.getrandbits(256):064x}"
        if kind == "cache blob":
            _sparse(blob, 2 << 30)
        snapshot = folder / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        (snapshot / "tokenizer.json").symlink_to(blob)
        overrides = [f"++policy.tokenizer.name={snapshot}"]
    return f"tokenizer: {kind}", None if usable else f"tokenizer {kind}", overrides


def _hub_cache(rng: random.Random, folder: Path, hub: Path, name: str) -> tuple[str, str | None]:
    """A model in the Hugging Face cache layout under ``hub`` whose ref or snapshot is broken."""
    repo = hub / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / f"{rng.getrandbits(160):040x}"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    ref, blob = repo / "refs" / "main", repo / "blobs" / f"{rng.getrandbits(256):064x}"
    kind = rng.choice(("good", "ref fifo", "ref huge", "ref directory", "ref elsewhere", "blob missing", "blob bad"))
    if kind in ("good", "blob bad"):
        _write(blob, _dump(base_config("LlamaForCausalLM")) if kind == "good" else '{"num_hidden_layers": 1e999}')
    if kind != "blob missing" or rng.random() < 0.5:
        (snapshot / "config.json").symlink_to(blob)
    if kind == "ref fifo":
        os.mkfifo(ref)
    elif kind == "ref huge":
        _sparse(ref, 1 << 30)
    elif kind == "ref directory":
        ref.mkdir()
    else:
        _write(ref, snapshot.name if kind != "ref elsewhere" else "f" * 40)
    unusable = {"blob bad": "num_hidden_layers=inf", "blob missing": "a dangling blob"}.get(kind)
    if kind == "blob missing" and not os.path.lexists(snapshot / "config.json"):
        unusable = None  # nothing there: missing, a note
    if kind.startswith("ref") and kind != "ref elsewhere":
        _write(blob, _dump(base_config("LlamaForCausalLM")))  # the one snapshot decides, and it is good
    return f"hub cache: {kind}", unusable


#: The recipe keys whose mappings are set on the model's config (or its Megatron attributes).
_OVERRIDE_KEYS = {
    "policy.hf_config_overrides": ("num_hidden_layers", "num_attention_heads", "head_dim", "sliding_window"),
    "policy.generation.vllm_kwargs.hf_overrides": ("num_hidden_layers", "num_key_value_heads", "rope_theta"),
    "policy.megatron_cfg.model_overrides": ("num_layers", "num_query_groups", "kv_channels", "hidden_size"),
}
_MEGATRON_POOLS = {
    "num_layers": POOLS["num_hidden_layers"],
    "num_query_groups": POOLS["num_key_value_heads"],
    "kv_channels": POOLS["head_dim"],
}


def _overrides(rng: random.Random, folder: Path) -> tuple[str, str | None, list[str]]:
    """A usable config.json and one recipe override of a model value."""
    _write(folder / "config.json", _dump(base_config("Qwen2ForCausalLM")))
    section = rng.choice(sorted(_OVERRIDE_KEYS))
    key = rng.choice(_OVERRIDE_KEYS[section])
    valid, invalid = _MEGATRON_POOLS.get(key) or POOLS[key]
    bad = rng.random() < 0.6
    value = rng.choice([v for v in (invalid if bad else valid) if not isinstance(v, dict) or v])
    override = f"++{section}.{key}={hydra_literal(value)}"
    return f"override {section}.{key}={value!r}"[:100], f"{key} breaks its limit" if bad else None, [override]


Family = Callable[[random.Random, Path], tuple]
_WEIGHTS = (("values", 50), ("structure", 15), ("file", 8), ("tokenizer", 12), ("hub", 5), ("overrides", 10))


def write_case(rng: random.Random, root: Path, index: int) -> ModelCase:
    """Write hostile model number ``index`` under ``root`` (its hub cache under ``root / "hub"``)."""
    family = rng.choices([name for name, _ in _WEIGHTS], [weight for _, weight in _WEIGHTS])[0]
    folder = root / f"m{index:05d}"
    model, extra = str(folder), []
    if family == "values":
        label, unusable = _values(rng, folder)
    elif family == "structure":
        label, unusable = _structure(rng, folder)
    elif family == "file":
        label, unusable = _file_kind(rng, folder)
    elif family == "tokenizer":
        label, unusable, extra = _tokenizer(rng, folder)
    elif family == "hub":
        model = f"hostile/m{index:05d}"
        label, unusable = _hub_cache(rng, folder, root / "hub", model)
    else:
        label, unusable, extra = _overrides(rng, folder)
    mode_000 = "mode 000" in label
    return ModelCase(f"#{index} {label}", [f"policy.model_name={model}", *extra], unusable, mode_000)


def write_cases(root: Path, count: int, seed: int = 0) -> list[ModelCase]:
    """``count`` hostile models under ``root`` (made world-readable where it is not mode 000, so a
    process without the permission override can reach them)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    return [write_case(rng, root, index) for index in range(count)]


# --- reading them as a process without root's permission override --------------------------------

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def without_file_permission_override() -> None:
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from this process and what it executes (Linux;
    a no-op for a user other than root): a file of mode 000 is then unreadable here, as for any user.
    Meant for a child (``preexec_fn``) or a worker process: it cannot be undone."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def mode_000_is_unreadable(folder: Path) -> bool:
    """Whether a file of mode 000 in ``folder`` is unreadable to this process."""
    probe = folder / ".mode-000-probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        with open(probe, "rb"):
            return False
    except PermissionError:
        return True
    finally:
        probe.unlink()
