"""Probe one NeMo-RL source tree with the plugin active: ``python -m tests.real_nemo_rl.host_probe TREE OUT.json``.

Run by ``test_real_worker_path.py`` in one process per ref (every ref's package is ``nemo_rl``),
with ``TREE`` and ``stand_ins/`` on ``PYTHONPATH``. It records facts only; the tests judge them.

* ``worker``: where the worker module imports (>= 0.6 layout), the real worker path on CPU
  (``tests/gpu/real_worker.py``: a tiny checkpoint, the tree's own GRPO recipe, the worker module's
  ``validate_and_set_config`` -> ``setup_model_config`` -> ``_apply_performance_config``) once with
  flash + FP32 and once with flash + BF16: the error and where it was raised, which functions' code
  was entered (a profile hook), every assignment to a model config's ``attention_backend`` (a spy on
  ``TransformerConfig.__setattr__``) and the records the plugin wrote. Where the worker module does
  not import (0.5.x), the exception and the line that raised it, and the 0.5.x seam read from the source.
* ``gpu_suite``: the NeMo-RL the GPU suite would drive here, and its real branch's CPU part.
* ``driver``: per ``nemo_rl/algorithms`` module that defines ``setup`` or a train function (read from
  the source), what the hook wrapped and the signatures; the names imported as ``examples/run_grpo.py``
  and ``run_sft.py`` import them; and ``setup`` called with a flash + FP32 ``MasterConfig`` (built as
  those scripts build it) under the same profile hook.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The tiny model of the worker-path probe (Megatron's names; ``tests/gpu/real_worker.write_checkpoint``).
TINY = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "vocab_size": 256,
    "seq_length": 128,
    "rotary_base": 10000,
}
FLASH_FP32 = ["policy.precision=float32", "++policy.megatron_cfg.attention_backend=flash"]
FLASH_BF16 = ["policy.precision=bfloat16", "++policy.megatron_cfg.attention_backend=flash"]
#: (recipe, the import line of examples/run_<algo>.py at 7ea279a, v0.7.0, v0.6.0, v0.5.0)
RECIPES = {
    "grpo": ("grpo_math_1B_megatron.yaml", "from nemo_rl.algorithms.grpo import MasterConfig, grpo_train, setup"),
    "sft": ("sft_openmathinstruct2_megatron.yaml", "from nemo_rl.algorithms.sft import MasterConfig, setup, sft_train"),
}


def _error(exc: BaseException) -> dict[str, Any]:
    frames = [(f.f_globals.get("__name__", "?"), f.f_code.co_name) for f, _ in traceback.walk_tb(exc.__traceback__)]
    return {
        "type": type(exc).__name__,
        "is_value_error": isinstance(exc, ValueError),
        "message": str(exc),
        "codes": [f.code for f in getattr(exc, "findings", [])],
        "frames": frames,
    }


def _profiled(action: Callable[[], Any], watched: dict[str, Any]) -> tuple[Any, dict | None, list[str]]:
    """``action()``'s result, its error (``_error``) and the names in ``watched`` whose code it entered."""
    codes = {code: name for name, code in watched.items()}
    entered: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            entered.append(codes[frame.f_code])

    sys.setprofile(profile)
    try:
        return action(), None, entered
    except Exception as exc:
        return None, _error(exc), entered
    finally:
        sys.setprofile(None)


def _spy_attention_backend() -> list[dict[str, str]]:
    """Every later ``<model config>.attention_backend = value``: the value and the function that set it."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    seen: list[dict[str, str]] = []
    original = TransformerConfig.__setattr__

    def __setattr__(self, name, value):
        if name == "attention_backend":
            caller = sys._getframe(1).f_code
            seen.append(
                {"value": getattr(value, "name", repr(value)), "function": caller.co_name, "file": caller.co_filename}
            )
        original(self, name, value)

    TransformerConfig.__setattr__ = __setattr__
    return seen


def _records(report_dir: Path) -> dict[str, Any]:
    from nemo_rl_attn_align.report.store import read_worker_files

    if not report_dir.exists():
        return {"written": False}
    found = read_worker_files(report_dir)
    return {
        "written": True,
        "unreadable": [str(u) for u in found.unreadable],
        "contracts": [record.contract.to_dict() for record in found.records],
        "details": [detail.to_dict() for detail in found.details.values()],
    }


def _worker_call(worker, setup, tree: Path, checkpoint: Path, overrides: list[str], report_dir: Path) -> dict[str, Any]:
    from nemo_rl_attn_align.hosts import megatron_worker
    from nemo_rl_attn_align.vocab.patching import original_of
    from tests.gpu import real_worker

    policy = real_worker.policy_config(tree, checkpoint, overrides)
    os.environ["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] = str(report_dir)
    watched = {
        "setup_model_config": setup.setup_model_config.__code__,
        "_apply_performance_config": original_of(setup._apply_performance_config).__code__,
    }
    runtime, error, entered = _profiled(lambda: real_worker.configure(worker, policy, checkpoint), watched)
    backend = getattr(getattr(runtime, "model_cfg", None), "attention_backend", None)
    return {
        "policy": policy,
        "error": error,
        "entered": entered,
        "attention_backend": getattr(backend, "name", None),
        "backend_mapped_by": megatron_worker.record.backend_mapped_by,
        "records": _records(report_dir),
    }


def _in_tree(filename: str, tree: Path) -> str:
    """``filename`` relative to ``tree`` when it is inside it, else as it is."""
    path = Path(filename).resolve()
    return str(path.relative_to(tree.resolve())) if path.is_relative_to(tree.resolve()) else filename


def _worker_inline_seam(tree: Path) -> dict[str, Any]:
    """The 0.5.x seam as the source has it: ``setup_megatron_model``'s parameters and who calls it."""
    source = ast.parse((tree / "nemo_rl/models/policy/workers/megatron_policy_worker.py").read_text())
    name = "setup_megatron_model"
    params = next(
        [a.arg for a in n.args.args] for n in source.body if isinstance(n, ast.FunctionDef) and n.name == name
    )
    methods = [
        (c, f) for c in source.body if isinstance(c, ast.ClassDef) for f in c.body if isinstance(f, ast.FunctionDef)
    ]
    callers = sorted(
        {
            f"{cls.name}.{fn.name}"
            for cls, fn in methods
            for call in ast.walk(fn)
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == name
        }
    )
    fp8 = ast.parse((tree / "nemo_rl/models/generation/fp8.py").read_text())
    vllm = sorted(
        {n.module for n in fp8.body if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm"}
    )
    return {
        "params": params,
        "called_by_name_in": callers,
        "fp8_module_level_vllm_imports": vllm,
        "vllm_importable": importlib.util.find_spec("vllm") is not None,
    }


def worker_path(tree: Path, workdir: Path) -> dict[str, Any]:
    from nemo_rl_attn_align.hosts import megatron_worker
    from nemo_rl_attn_align.vocab import patching as _patching
    from tests.gpu import real_worker

    try:
        worker = importlib.import_module(real_worker.WORKER)
    except ImportError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return {
            "imported": False,
            "type": type(exc).__name__,
            "name": getattr(exc, "name", None),
            "message": str(exc),
            "file": _in_tree(frame.filename, tree),
            "line": frame.lineno,
            "seam": _worker_inline_seam(tree),
        }
    setup = sys.modules["nemo_rl.models.megatron.setup"]
    out: dict[str, Any] = {
        "imported": True,
        "layout": megatron_worker.record.layout,
        "wrapped": sorted(
            f"{m.__name__}.{n}"
            for m, n in (
                (setup, "_apply_performance_config"),
                (worker, "validate_and_set_config"),
                (worker, "setup_model_and_optimizer"),
            )
            if _patching.is_wrapped(getattr(m, n))
        ),
    }
    checkpoint = real_worker.write_checkpoint(workdir / "checkpoint", TINY)
    assignments = _spy_attention_backend()
    out["fp32"] = _worker_call(worker, setup, tree, checkpoint, FLASH_FP32, workdir / "report-fp32")
    out["fp32"]["assignments"] = list(assignments)
    assignments.clear()
    out["bf16"] = _worker_call(worker, setup, tree, checkpoint, FLASH_BF16, workdir / "report-bf16")
    out["bf16"]["assignments"] = [dict(a, file=_in_tree(a["file"], tree)) for a in assignments]
    return out


def gpu_suite(workdir: Path) -> dict[str, Any]:
    """What the GPU suite's ``model_runner`` would drive here: ``nemo_rl_host.locate()``, and its real
    branch's CPU part (``real_worker``: checkpoint, recipe, ``configure``) for every policy it is sent."""
    from tests.gpu import cases, nemo_rl_host, real_worker

    host = nemo_rl_host.locate()
    out: dict[str, Any] = {"host": host.to_dict(), "line": host.line(), "cases": []}
    worker = sys.modules.get(real_worker.WORKER)
    if worker is None:
        return out
    for number, case in enumerate(cases.model_runner_policies()):
        checkpoint = real_worker.write_checkpoint(workdir / f"gpu-case-{number}", case["standin_model"])
        policy = real_worker.policy_config(real_worker.nemo_rl_tree(), checkpoint, real_worker.case_overrides(case))
        runtime, error, _ = _profiled(
            lambda policy=policy, checkpoint=checkpoint: real_worker.configure(worker, policy, checkpoint), {}
        )
        model = getattr(runtime, "model_cfg", None)
        out["cases"].append(
            {
                "case": case,
                "error": error,
                "model": None
                if model is None
                else {
                    "attention_backend": model.attention_backend.name,
                    "params_dtype": str(model.params_dtype),
                    "layer_spec": getattr(model.transformer_layer_spec, "__name__", None),
                    **{key: getattr(model, key) for key in case["standin_model"]},
                },
            }
        )
    return out


def _defined(path: Path) -> dict[str, list[str]]:
    """Top-level public functions of a source file: name -> parameter names."""
    return {
        n.name: [a.arg for a in n.args.args]
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }


def _module_hook(name: str, defined: dict[str, list[str]]) -> dict[str, Any]:
    from nemo_rl_attn_align.vocab.patching import is_wrapped, original_of

    module = importlib.import_module(name)
    trains = sorted(f for f in defined if f.endswith("_train") or "_train_" in f)
    wrapped = sorted(f for f in ("setup", *trains) if is_wrapped(getattr(module, f, None)))
    out: dict[str, Any] = {"train_functions": trains, "wrapped": wrapped}
    if "setup" in defined:
        original = original_of(module.setup)
        out["setup_params"] = defined["setup"]
        out["signature_kept"] = str(inspect.signature(module.setup)) == str(inspect.signature(original))
    return out


def _flash_fp32_setup(tree: Path, algorithm: str) -> dict[str, Any]:
    from nemo_rl.utils.config import load_config, parse_hydra_overrides
    from omegaconf import OmegaConf

    from nemo_rl_attn_align.hosts import handoff
    from nemo_rl_attn_align.vocab.patching import is_wrapped, original_of

    recipe, import_line = RECIPES[algorithm]
    names: dict[str, Any] = {}
    exec(import_line, names)
    module = sys.modules[f"nemo_rl.algorithms.{algorithm}"]
    imported = {
        n: is_wrapped(v) and v is getattr(module, n) for n, v in names.items() if callable(v) and n != "MasterConfig"
    }
    composed = load_config(str(tree / "examples" / "configs" / recipe))
    cfg = OmegaConf.to_container(parse_hydra_overrides(composed, FLASH_FP32), resolve=True)
    os.environ.pop(handoff.SETTINGS_ENV, None)
    original = original_of(names["setup"])
    master = names["MasterConfig"](**cfg)  # as run_<algo>.py builds it: a pydantic model (>= 0.7) or a dict
    _, error, entered = _profiled(lambda: names["setup"](master, None, None, None), {"setup": original.__code__})
    return {
        "imported_wrapped": imported,
        "master_config_type": type(master).__name__,
        "error": error,
        "original_setup_entered": entered,
        "settings_exported": handoff.SETTINGS_ENV in os.environ,
    }


def driver_hook(tree: Path) -> dict[str, Any]:
    from tests.gpu.real_worker import register_resolvers

    register_resolvers()
    modules = {}
    for path in sorted((tree / "nemo_rl" / "algorithms").glob("*.py")):
        defined = _defined(path)
        if "setup" in defined or any(f.endswith("_train") or "_train_" in f for f in defined):
            modules[f"nemo_rl.algorithms.{path.stem}"] = _module_hook(f"nemo_rl.algorithms.{path.stem}", defined)
    return {"modules": modules, "flash_fp32": {algorithm: _flash_fp32_setup(tree, algorithm) for algorithm in RECIPES}}


class _Warnings(logging.Handler):
    """The plugin's warnings, as logged."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main(tree: Path, out: Path) -> None:
    warnings = _Warnings()
    logging.getLogger("nemo_rl_attn_align").addHandler(warnings)
    import attn_align_stand_ins  # noqa: F401 - Transformer Engine and the names megatron-core 0.19.2 lacks

    with tempfile.TemporaryDirectory() as workdir:
        result = {
            "worker": worker_path(tree, Path(workdir)),
            "gpu_suite": gpu_suite(Path(workdir)),
            "driver": driver_hook(tree),
            "plugin_warnings": warnings.lines,
        }
    out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
