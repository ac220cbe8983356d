"""What the GPU tests share: running one case in a fresh subprocess, and the configs they send it.

No torch, TE, megatron or vLLM here: the tests import this at collection, on any machine. Each case is a
runner module of this package (``python -m tests.gpu.<runner> SPEC.json RESULT.json``) started
from the repository root with a clean attention environment (no NVTE_* left over from this
process, so Megatron's own ``_set_attention_backend`` sets them as in a real worker). A runner
writes its result as JSON; an expected failure (the plugin stopping a config) is part of the
result, anything else exits non-zero and the test fails with the runner's stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fake_nemo_rl.configs import policy_config as standin_policy_config
from tests.gpu.nemo_rl_host import locate

REPO = Path(__file__).resolve().parents[2]
#: Where ``run_gpu_checks.sh`` collects every case's spec and result (unset: nowhere).
ARTIFACTS_ENV = "NEMO_RL_ATTN_ALIGN_GPU_ARTIFACTS"
#: Variables a case must not inherit: the backend and determinism switches are set per case.
CLEARED = (
    "NVTE_FLASH_ATTN",
    "NVTE_FUSED_ATTN",
    "NVTE_UNFUSED_ATTN",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "NVTE_DEBUG",
    "NVTE_DEBUG_LEVEL",
    "CUBLAS_WORKSPACE_CONFIG",
    "NEMO_RL_ATTN_ALIGN",
    "NEMO_RL_ATTN_ALIGN_SETTINGS",
    "NEMO_RL_ATTN_ALIGN_REPORT_DIR",
    "NEMO_RL_ATTN_ALIGN_STRICT",
    "VLLM_BATCH_INVARIANT",
    "VLLM_ATTENTION_BACKEND",
)
#: The tiny model every Megatron case builds: head dim 64 (supported by every TE backend and
#: FA2/FA3), GQA 4:2, no dropout (NeMo-RL trains RL policies without it).
TINY_GPT = {
    "num_layers": 2,
    "hidden_size": 256,
    "ffn_hidden_size": 1024,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "vocab_size": 1024,
    "seq_length": 256,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}


#: (attention_backend, transformer_impl) of every backend case: each TE backend with the TE layer
#: spec, ``local`` with Megatron's local spec.
BACKEND_CASES = (
    ("flash", "transformer_engine"),
    ("fused", "transformer_engine"),
    ("unfused", "transformer_engine"),
    ("auto", "transformer_engine"),
    ("local", "local"),
)

#: The tiny Llama the vLLM test writes (``LlamaConfig`` keyword arguments; default RoPE, theta 10000).
TINY_LLAMA = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
}


def megatron_model_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The TransformerConfig fields a Megatron worker derives from a Llama ``config.json`` (as
    Megatron-Bridge's provider does); RoPE theta from ``rope_theta`` or, in transformers 5,
    ``rope_parameters.rope_theta``."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = hf.get("rope_theta", rope.get("rope_theta"))
    return {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "ffn_hidden_size": hf["intermediate_size"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_query_groups": hf["num_key_value_heads"],
        "kv_channels": hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        "vocab_size": hf["vocab_size"],
        "seq_length": hf["max_position_embeddings"],
        **({"rotary_base": theta} if theta is not None else {}),
    }


def policy_config(
    backend: str,
    precision: str = "bfloat16",
    impl: str = "transformer_engine",
    model: Mapping[str, Any] | None = None,
    tokenizer: str = "standin/tiny",
) -> dict[str, Any]:
    """The stand-in's resolved ``policy`` section (``tests/fake_nemo_rl/configs.py``) for the tiny GPU
    model; ``standin_model`` takes the place of the checkpoint's model config there (on the real
    worker path, ``real_worker`` writes it into a checkpoint and maps the rest to overrides)."""
    return standin_policy_config(
        backend,
        precision,
        impl,
        model_name=tokenizer,
        tokenizer={"name": tokenizer},
        standin_model={**TINY_GPT, "transformer_impl": impl, **(model or {})},
    )


def model_runner_policies() -> list[dict[str, Any]]:
    """Every policy the GPU tests send to ``model_runner`` (the vLLM binding case's model as
    ``megatron_model_from_hf`` reads it from ``TINY_LLAMA``'s ``config.json``)."""
    return [policy_config(backend, impl=impl) for backend, impl in BACKEND_CASES] + [
        policy_config("flash", precision="float32"),
        policy_config("flash", model={"deterministic_mode": True}),
        policy_config("flash", model=megatron_model_from_hf({**TINY_LLAMA, "rope_theta": 10000.0})),
    ]


#: What the training side of the batch-invariant binding case sets to match vLLM's batch-invariant
#: mode (which sets it in its worker); Megatron's deterministic mode is off there.
CUBLAS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def master_config(policy: dict, batch_invariant: bool) -> dict:
    """The NeMo-RL config both runs stand for: Megatron training, vLLM generation."""
    vllm_env = {"VLLM_BATCH_INVARIANT": "1"} if batch_invariant else {}
    megatron_cfg = {**policy["megatron_cfg"], "env_vars": dict(CUBLAS) if batch_invariant else {}}
    generation = {
        "backend": "vllm",
        "vllm_cfg": {"precision": "bfloat16", "tensor_parallel_size": 1, "env_vars": vllm_env},
        "vllm_kwargs": {},
    }
    return {"policy": {**policy, "megatron_cfg": megatron_cfg, "generation": generation}}


def case_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the per-case switches, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


def run_case(
    runner: str,
    spec: Mapping[str, Any],
    workdir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    name: str = "case",
) -> dict[str, Any]:
    """Run ``tests.gpu.<runner>`` on ``spec`` in a fresh process; its JSON result.

    ``env`` is added to the cleaned environment. A crash or a missing result fails the test with the
    last lines the runner wrote."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec = {"workdir": str(workdir / name), **spec}  # where a runner may write files of its own
    spec_path.write_text(json.dumps(spec, indent=1, sort_keys=True))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"tests.gpu.{runner}", str(spec_path), str(result_path)],
            cwd=REPO,
            env=case_environment(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{runner} ({name}) ran past {timeout} s; its stderr ended with:\n{_tail(err.stderr)}")
    (workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    _keep(workdir, name)
    if proc.returncode != 0 or not result_path.exists():
        pytest.fail(
            f"{runner} ({name}) exited {proc.returncode}; its output ended with:\n{_tail(proc.stdout + proc.stderr)}"
        )
    result = json.loads(result_path.read_text())
    if "nemo_rl" in result:  # the runner drove the NeMo-RL the suite's summary names
        assert result["nemo_rl"] == locate().to_dict(), result["nemo_rl"]
    return result


def _tail(text: Any, lines: int = 40) -> str:
    text = text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
    return "\n".join(text.splitlines()[-lines:])


def _keep(workdir: Path, name: str) -> None:
    target = os.environ.get(ARTIFACTS_ENV)
    if not target:
        return
    dest = Path(target) / "cases" / workdir.name
    dest.mkdir(parents=True, exist_ok=True)
    for path in workdir.glob(f"{name}.*"):
        shutil.copy2(path, dest / path.name)
