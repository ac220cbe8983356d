"""Hostile configs for ``check``: value pools for every key the rules and settings read, a run of
``check`` in-process, and an oracle of what NeMo-RL, Megatron or the documented ``attention_align``
schema reject.

The oracle is written from the hosts' own behaviour (NeMo-RL 7ea279a ``lm_policy.py`` /
``megatron/setup.py``, megatron-core 0.16 ``TransformerConfig``, Transformer Engine's backend
filters), not from this plugin's rules, so a rule that quietly accepts a value the host rejects is
caught. ``tests/test_hostile_properties.py`` draws from these pools with hypothesis;
``benchmarks/fuzz_check.py`` draws tens of thousands at random.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nemo_rl_attn_align.cli import main as cli_main
from nemo_rl_attn_align.vocab.exit_codes import EXIT_INTERNAL_ERROR

#: Marks "remove the key".
UNSET = "<unset>"

BACKENDS = ("flash", "fused", "unfused", "local", "auto")
PRECISIONS = ("float32", "bfloat16", "float16")
IMPLS = ("transformer_engine", "local", "inference_optimized")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")

_M = "policy.megatron_cfg"
_MO = f"{_M}.model_overrides"
_A = "attention_align"
_ODD = [
    None,
    "",
    " ",
    [],
    {},
    [1],
    {"a": 1},
    1.5,
    -1,
    0,
    True,
    False,
    float("nan"),
    float("inf"),
    "line\nbreak",
    "x" * 3000,
]

#: dotted key -> values to draw (valid ones, near misses, wrong types, broken structure).
POOLS: dict[str, list] = {
    f"{_M}.enabled": [True, False, UNSET],
    f"{_M}.attention_backend": [
        *BACKENDS,
        None,
        UNSET,
        "Flash",
        " flash",
        "flash_attn",
        "FLASH",
        1,
        True,
        [],
        {"a": 1},
        "x" * 3000,
    ],
    "policy.precision": [*PRECISIONS, "bf16", "fp32", "BFLOAT16", "half", 16, True, None, [], "bfloat16\n"],
    f"{_M}.pipeline_dtype": [*PRECISIONS, UNSET, "bf16", None, 1, {}],
    f"{_M}.transformer_impl": [*IMPLS, UNSET, "TE", "te", "Local", "", None, 1, True, ["local"]],
    f"{_M}.context_parallel_size": [1, 2, 4, 8, True, "2", "1", 2.0, 1.0, 0, -1, None, 1.5, [2], {}, 10**30, UNSET],
    f"{_M}.tensor_model_parallel_size": [1, 1, 1, UNSET, True, "2", 2.0],
    f"{_M}.pipeline_model_parallel_size": [1, 1, 1, UNSET, True, False, 0],
    f"{_MO}.softmax_type": [*SOFTMAX_TYPES, UNSET, "sinks", "", None, 1, ["vanilla"]],
    f"{_MO}.batch_invariant_mode": [True, False, UNSET, 1, 0, "false", "yes", "", None, [], [0]],
    f"{_MO}.cp_comm_type": [*CP_COMM_TYPES, UNSET, "ring", "allgather", "", None, ["p2p", "a2a"], ["bogus"], [], 3],
    f"{_MO}.params_dtype": [UNSET, "float32", "bfloat16"],
    f"{_MO}.attention_backend": [UNSET, UNSET, "fused"],
    f"{_MO}.deterministic_mode": [UNSET, True, 1, "x"],
    f"{_M}.model_overrides": [UNSET, None, {}, "oops", 5, [], [1], True],
    f"{_M}.env_vars": [
        UNSET,
        None,
        {},
        {"NVTE_FLASH_ATTN": "0"},
        {"NVTE_FUSED_ATTN": 1},
        {"NVTE_UNFUSED_ATTN": "1"},
        {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1"},
        "NVTE_FLASH_ATTN=1",
        ["a"],
        5,
    ],
    _M: [UNSET, "flash", 1, [], None],
    "policy.model_name": ["Qwen/Qwen3-8B", "openai/gpt-oss-20b", "", 7, None, ["x"]],
    f"{_A}.on_mismatch": [
        UNSET,
        "error",
        "warn",
        "record",
        "Warn",
        "",
        None,
        1,
        True,
        {"identity": "warn"},
        {"semantic": "error", "identity": "record"},
        {"identty": "warn"},
        {"semantic": "stop"},
    ],
    f"{_A}.allow_dtype_difference": [UNSET, True, False, "true", 1, 0, None],
    f"{_A}.strict": [UNSET, True, False, "yes", 1, None],
    f"{_A}.preset": [UNSET, "aligned", None, "align", "Aligned", "", 1, True, ["aligned"]],
    f"{_A}.report_dir": [UNSET, "out/dir", "a/../b", "", "   ", 5, None, ["x"]],
    f"{_A}.mandate.merge_rule": [UNSET, "online_softmax_lse", "full_softmax", None, "bogus", 1, True],
    f"{_A}.mandate.reduction_order": [UNSET, "kv_index", "split_kv", "unspecified", None, "bogus", [], 2.0],
    f"{_A}.mandate.acc_dtype": [UNSET, "fp32", "bf16", None, "bogus", 32],
    f"{_A}.mandate.downcast": [UNSET, "final_write", "per_partial", None, "bogus", False],
    f"{_A}.mandate.dtype": [UNSET, "bf16", "fp32", None, "bogus", 16],
    f"{_A}.drift.heads": [UNSET, 32, 1, 0, -1, True, "32", 2.0, None, 1.5],
    f"{_A}.drift.kv_heads": [UNSET, 8, 0, False, "8", 8.0],
    f"{_A}.drift.head_dim": [UNSET, 128, -4, "128", 128.0, True],
    f"{_A}.drift.window": [UNSET, None, 0, 4096, -1, True, "0", 0.0],
    f"{_A}.drift.seq_len": [UNSET, 2048, 0, "2048", 2048.0, True],
    f"{_A}.bogus_key": [UNSET, UNSET, UNSET, 1],
    _A: [UNSET, UNSET, None, "warn", 3, []],
}

#: ``megatron_cfg.enabled`` as NeMo-RL reads it: any truthy value enables Megatron.
POOLS[f"{_M}.enabled"] = [*POOLS.get(f"{_M}.enabled", []), 1, 0, "yes", "false", "", None, [1]]

#: The oracle's reading of the attention_align schema (docs/running-in-nemo-rl.md's "Settings" table).
_MANDATE_VALUES = {
    "merge_rule": ("online_softmax_lse", "full_softmax"),
    "reduction_order": ("kv_index", "ring_step", "split_kv", "unspecified"),
    "acc_dtype": ("fp32", "bf16", "fp16", "fp8"),
    "downcast": ("final_write", "per_partial"),
    "dtype": ("fp32", "bf16", "fp16", "fp8"),
}


def is_unset(value: Any) -> bool:
    """True for the ``UNSET`` marker."""
    return isinstance(value, str) and value == UNSET


def set_path(cfg: dict, dotted: str, value: Any) -> None:
    """Set (or, with ``UNSET``, remove) ``dotted`` in ``cfg``, making parents mappings as needed."""
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
        if not isinstance(node.get(part), dict):
            if is_unset(value):
                return
            node[part] = {}
        node = node[part]
    if is_unset(value):
        node.pop(leaf, None)
    else:
        node[leaf] = copy.deepcopy(value)  # the pools' lists and dicts are shared: never alias them


def _truthy(value: Any) -> bool:
    return bool(value)


def _is_int_count(value: Any) -> bool:
    # not a bool: NeMo-RL lays its workers out with np.arange(world_size).reshape(pp, -1, cp, tp), which
    # raises TypeError on one
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def rejection(cfg: dict) -> str | None:
    """Why NeMo-RL, Megatron, Transformer Engine or the attention_align schema reject ``cfg``
    (a resolved config), or None when no rule of theirs modelled here does. Megatron counts as
    enabled when ``megatron_cfg.enabled`` is truthy, as NeMo-RL's ``bool(...get("enabled", False))``
    reads it."""
    policy = cfg.get("policy")
    if not isinstance(policy, dict):
        return "policy is not a mapping"
    why = _attention_align_rejection(cfg)
    if why:
        return why
    precision = policy.get("precision", UNSET)
    if not is_unset(precision) and not (isinstance(precision, str) and precision in PRECISIONS):
        return "NeMo-RL dtype_map has no such policy.precision"
    name = policy.get("model_name", UNSET)
    if not is_unset(name) and not (isinstance(name, str) and name.strip()):
        return "policy.model_name is not a model id"
    mcfg = policy.get("megatron_cfg", UNSET)
    if is_unset(mcfg):
        return None
    if not isinstance(mcfg, dict):
        return "NeMo-RL calls policy.megatron_cfg.get('enabled')"
    enabled = mcfg.get("enabled", False)
    if not _truthy(enabled):
        return None
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        if key not in mcfg:
            return f"NeMo-RL's Policy indexes megatron_cfg[{key!r}] (KeyError)"
    return _megatron_rejection(mcfg, precision)


def _megatron_rejection(mcfg: dict, precision: Any) -> str | None:
    pipeline = mcfg.get("pipeline_dtype", UNSET)
    if not is_unset(pipeline) and not (isinstance(pipeline, str) and pipeline in PRECISIONS):
        return "pipeline_dtype not in NeMo-RL's dtype_map"
    backend = mcfg.get("attention_backend", UNSET)
    unset_backend = backend is None or is_unset(backend)
    if not unset_backend and not (isinstance(backend, str) and backend in BACKENDS):
        return "AttnBackend[...] KeyError"
    effective = "auto" if unset_backend else backend
    impl = mcfg.get("transformer_impl", UNSET)
    if not is_unset(impl) and not (isinstance(impl, str) and impl in IMPLS):
        return "TransformerConfig.transformer_impl Literal"
    impl = "transformer_engine" if is_unset(impl) else impl
    for size in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        if not _is_int_count(mcfg[size]):
            return f"{size} is not an integer >= 1 (NeMo-RL's layout reshape)"
    cp = mcfg["context_parallel_size"]
    overrides = mcfg.get("model_overrides", UNSET)
    if not isinstance(overrides, dict) and not is_unset(overrides) and bool(overrides):
        return "NeMo-RL iterates model_overrides.items()"
    overrides = overrides if isinstance(overrides, dict) else {}
    env_vars = mcfg.get("env_vars", UNSET)
    if not isinstance(env_vars, dict) and not is_unset(env_vars) and bool(env_vars):
        return "NeMo-RL builds dict(env_vars)"
    for first_class in ("attention_backend", "transformer_impl", "context_parallel_size"):
        if first_class in overrides:
            return "NeMo-RL _validate_model_override_conflicts"
    softmax = overrides.get("softmax_type")
    if softmax is not None and not (isinstance(softmax, str) and softmax in SOFTMAX_TYPES):
        return "TransformerConfig.softmax_type Literal"
    te = impl != "local"
    if effective in ("flash", "fused") and precision == "float32" and te:
        return "TE has no fp32 flash/fused attention"
    if effective == "local" and impl != "local":
        return "local backend with the TE layer spec leaves TE no backend"
    if cp > 1:
        if not te:
            return "Megatron's DotProductAttention has no CP"
        comm = overrides.get("cp_comm_type")
        comms = comm if isinstance(comm, list) else [comm]
        if comm is not None and not (comms and all(isinstance(c, str) and c in CP_COMM_TYPES for c in comms)):
            return "TE's CP attention has no such cp_comm_type"
        if effective == "unfused":
            return "TE disables Unfused under CP"
        if effective == "auto" and precision == "float32":
            return "TE finds no fp32 backend under CP"
    if effective == "flash" and te and softmax in ("off-by-one", "learnable"):
        return "TE disables FlashAttention for non-vanilla softmax"
    if bool(overrides.get("batch_invariant_mode")):  # Megatron: `if self.batch_invariant_mode:`
        if effective != "flash":
            return "TransformerConfig asserts flash for batch_invariant_mode"
        if precision != "bfloat16" or cp > 1:
            return "batch-invariant kernels need bf16 and CP 1"
    if unset_backend and isinstance(env_vars, dict):
        for name in NVTE:
            if name in env_vars and env_vars[name] is not None and str(env_vars[name]) != "1":
                return "Megatron asserts NVTE_* agree with auto"
    return None


def _on_mismatch_ok(value) -> bool:
    """One mode, or a mapping of the two tiers (each optional) to modes."""
    modes = ("error", "warn", "record")
    if isinstance(value, dict):
        return set(value) <= {"identity", "semantic"} and all(isinstance(v, str) and v in modes for v in value.values())
    return isinstance(value, str) and value in modes


def _attention_align_rejection(cfg: dict) -> str | None:
    block = cfg.get(_A, UNSET)
    if block is None or is_unset(block):
        return None
    if not isinstance(block, dict):
        return "attention_align is not a mapping"
    known = {"on_mismatch", "preset", "allow_dtype_difference", "strict", "report_dir", "mandate", "drift"}
    if set(block) - known:
        return "unknown attention_align key"
    if block.get("preset") not in (None, "aligned"):
        return "preset"
    if "on_mismatch" in block and not _on_mismatch_ok(block["on_mismatch"]):
        return "on_mismatch"
    for flag in ("allow_dtype_difference", "strict"):
        if flag in block and not isinstance(block[flag], bool):
            return flag
    if (
        "report_dir" in block
        and block["report_dir"] is not None
        and not (isinstance(block["report_dir"], str) and block["report_dir"].strip())
    ):
        return "report_dir"
    mandate = block.get("mandate", {})
    if not isinstance(mandate, dict):
        return "mandate is not a mapping"
    for key, value in mandate.items():
        if key not in _MANDATE_VALUES:
            return "unknown mandate key"
        if value is not None and not (isinstance(value, str) and value in _MANDATE_VALUES[key]):
            return f"mandate.{key}"
    drift = block.get("drift", {})
    if not isinstance(drift, dict):
        return "drift is not a mapping"
    for key, value in drift.items():
        if key not in ("heads", "kv_heads", "head_dim", "window", "seq_len"):
            return "unknown drift key"
        if value is None:
            continue
        if type(value) is not int or value < (0 if key == "window" else 1):
            return f"drift.{key} is not a strict integer in range"
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def strict_json_loads(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and -Infinity."""
    return json.loads(text, parse_constant=_reject_constant)


@dataclass
class Outcome:
    """One in-process run of ``nemo-rl-attn-align check``."""

    exit_code: Any
    stdout: str
    stderr: str
    exception: BaseException | None = None
    problems: list = field(default_factory=list)


def run_check(path: Path, overrides: list[str] = (), as_json: bool = False) -> Outcome:
    """``check [--json] PATH OVERRIDES...`` through the CLI's own entry point, in this process;
    an exception is caught and returned (it would have been a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["check", *(["--json"] if as_json else []), str(path), *overrides]
    exception = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
        except BaseException as exc:
            code, exception = None, exc
    outcome = Outcome(code, out.getvalue(), err.getvalue(), exception)
    outcome.problems = output_problems(outcome, as_json)
    return outcome


def output_problems(outcome: Outcome, as_json: bool) -> list[str]:
    """What is wrong with an outcome's form: a traceback or internal error (exit 3), an exit code
    outside {0, 1, 2}, an error message over more than one line, JSON a strict parser refuses, a
    finding spread over lines."""
    problems = []
    if outcome.exception is not None:
        problems.append(f"traceback: {type(outcome.exception).__name__}: {str(outcome.exception)[:200]}")
        return problems
    if outcome.exit_code == EXIT_INTERNAL_ERROR:  # what a traceback is now: one line and exit 3
        problems.append(f"internal error: {outcome.stderr.strip()[:200]}")
        return problems
    if outcome.exit_code not in (0, 1, 2):
        problems.append(f"exit code {outcome.exit_code!r}")
    if outcome.exit_code == 2 and outcome.stderr.count("\n") != 1:
        problems.append(f"usage error on {outcome.stderr.count(chr(10))} lines")
    if as_json:
        try:
            doc = strict_json_loads(outcome.stdout)
        except ValueError as exc:
            problems.append(f"JSON refused by a strict parser: {exc}")
            return problems
        if doc.get("exit_code") != outcome.exit_code:
            problems.append("JSON exit_code differs from the exit code")
        if "\n" in str(doc.get("error", "")):
            problems.append("JSON error spans lines")
        for finding in (doc.get("plan") or {}).get("findings", []):
            if any("\n" in str(finding[k]) for k in ("key", "message", "fix")):
                problems.append(f"finding {finding['code']} spans lines")
    else:
        for line in outcome.stdout.splitlines():
            if line.startswith(("error ", "warning ")) and len(line) > 3000:
                problems.append(f"finding line of {len(line)} characters")
    return problems


def write_config(path: Path, cfg: dict) -> None:
    """``cfg`` as a YAML file (the C emitter where available)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(cfg, Dumper=dumper, allow_unicode=True), encoding="utf-8")


def hydra_literal(value: Any) -> str:
    """``value`` in Hydra's override grammar (quoted strings, ``null``, ``true``, lists, dicts)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value == math.inf else ("-inf" if value == -math.inf else repr(value)))
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_literal(v)}" for k, v in value.items()) + "}"
    return str(value)


def random_mutation(rng: random.Random) -> dict[str, Any]:
    """A random set of (key -> value) changes: usually a few keys, sometimes many; values from
    ``POOLS`` and the odd-value list."""
    pools = dict(POOLS)
    weighted = [key for key in sorted(pools) for _ in range(1 if key.startswith(_A) else 4)]  # the rules' keys first
    count = rng.choice((1, 1, 2, 2, 3, 4, 6, 10))
    keys: list[str] = []
    while len(keys) < count:
        key = rng.choice(weighted)
        if key not in keys:
            keys.append(key)
    changes = {}
    for key in keys:
        pool = pools[key]
        changes[key] = copy.deepcopy(rng.choice(pool) if rng.random() < 0.85 else rng.choice(_ODD))
    return changes
