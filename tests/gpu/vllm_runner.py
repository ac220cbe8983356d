"""A vLLM engine on a tiny random Llama, with the plugin installed: ``python -m tests.gpu.vllm_runner SPEC RESULT``.

The model is written locally (``transformers``, random weights, no hub). The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as NeMo-RL runs it inside its generation actor);
nothing here registers the plugin: vLLM's ``vllm.general_plugins`` entry point and the ``.pth``
bootstrap are the doors, and the result says which were open. The parent sets
``NEMO_RL_ATTN_ALIGN_REPORT_DIR`` (and ``VLLM_BATCH_INVARIANT`` for that mode); the record the
plugin writes there is read by the test.

Spec: ``{"model_dir": str, "hf_config": {LlamaConfig kwargs}, "seed": int, "prompt": [token ids]}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.gpu.runner_io import main

PLUGIN_ENTRY_POINT = "nemo_rl_attn_align"


def write_tiny_llama(model_dir: Path, hf_config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Save a random-weight Llama with ``hf_config`` in BF16; return the ``config.json`` written."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**hf_config)).to(torch.bfloat16).save_pretrained(model_dir)
    return json.loads((model_dir / "config.json").read_text())


def entry_point_listed() -> bool:
    """Whether this environment's metadata lists the plugin's ``vllm.general_plugins`` entry point."""
    from importlib.metadata import entry_points

    return any(ep.name == PLUGIN_ENTRY_POINT for ep in entry_points(group="vllm.general_plugins"))


def run(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir = Path(spec["model_dir"])
    config_json = write_tiny_llama(model_dir, spec["hf_config"], spec.get("seed", 0))
    import vllm

    from nemo_rl_attn_align.hosts import bootstrap, vllm_worker
    from nemo_rl_attn_align.vocab import patching as _patching

    llm = vllm.LLM(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        max_model_len=spec["hf_config"]["max_position_embeddings"],
        seed=spec.get("seed", 0),
    )
    params = vllm.SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": spec.get("prompt", [1, 2, 3, 4, 5])}], params)
    worker_cls = getattr(sys.modules.get("vllm.v1.worker.gpu_worker"), "Worker", None)
    record = vllm_worker.record
    return {
        "vllm": getattr(vllm, "__version__", None),
        "config_json": config_json,
        "entry_point_listed": entry_point_listed(),
        "bootstrap_origin": bootstrap.origin,
        "seam_wrapped": worker_cls is not None
        and _patching.is_wrapped(getattr(worker_cls, "compile_or_warm_up_model", None)),
        "worker_id": record.worker_id if record else None,
        "stage": record.stage if record else None,
        "findings": list(record.findings) if record else None,
        "layer_backends": dict(record.snapshot.layer_backends) if record else None,
        "generated": list(outputs[0].outputs[0].token_ids),
    }


if __name__ == "__main__":
    sys.exit(main(run))
