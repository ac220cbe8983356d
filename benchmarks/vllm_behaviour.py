"""What reading the behaviour fields costs a vLLM worker once, at engine start (target: at most 1 s
for a 1B-shaped model on 2 CPU cores; nothing per step: the hook reads once, after warm-up).

For each model below, vLLM builds its own model class on the CPU from a ``config.json`` (as
``hosts.model_readers.read_vllm`` does, on the CPU instead of the meta device, so the rotary modules
hold real caches): the attention layers, their impls and rotary modules are vLLM's. The attention
shape is the named model's (layers, heads, head dim, max_position_embeddings, RoPE); the vocabulary
and MLP are shrunk (they play no part in the reading) to keep memory small. Then
``hosts.vllm_behaviour.read_behaviour`` runs as the hook runs it: the first run and the median of
``--runs`` more, and each field's time alone.

    python benchmarks/vllm_behaviour.py [--runs 5] [--threads N]   # in a venv with vLLM (lane vllm's)

Exit codes: 0 every model read within the target, 1 some model over it or a field unobservable,
2 no vLLM here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's package, installed or not

TARGET_S = 1.0
SMALL = {"vocab_size": 1024, "intermediate_size": 256, "tie_word_embeddings": True}
#: name -> config.json: the named model's attention shape and RoPE, the rest SMALL.
MODELS = {
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "Qwen3-1.7B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
    },
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
    },
}


def build(config: dict, folder: Path):
    """vLLM's model for ``config`` on the CPU (weights allocated, not loaded), its layers registered."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import get_model_architecture

    from nemo_rl_attn_align.hosts.model_readers import _cpu_backend, _init_distributed

    (folder / "config.json").write_text(json.dumps({**config, **SMALL}))
    engine_args = EngineArgs(
        model=str(folder), skip_tokenizer_init=True, dtype="bfloat16", load_format="dummy", enforce_eager=True,
        **_cpu_backend(),
    )  # fmt: skip
    vllm_config = engine_args.create_engine_config()
    _init_distributed(vllm_config)
    with set_current_vllm_config(vllm_config), torch.device("cpu"):
        model_class, _ = get_model_architecture(vllm_config.model_config)
        model = model_class(vllm_config=vllm_config, prefix="")
    return vllm_config.compilation_config.static_forward_context, dict(model.named_modules())


def measure(name: str, config: dict, runs: int) -> dict:
    from nemo_rl_attn_align.hosts import vllm_behaviour

    with tempfile.TemporaryDirectory() as tmp:
        context, modules = build(config, Path(tmp))
    times: list[float] = []

    def read():
        start = time.perf_counter()
        fields, _ = vllm_behaviour.read_behaviour(context, modules)
        times.append(time.perf_counter() - start)
        return fields

    fields = read()  # the first, as the hook runs it once
    layers = vllm_behaviour.attention_layers(context, modules)
    shares = {}
    for field, reader in vllm_behaviour.READERS.items():
        start = time.perf_counter()
        reader(layers)
        shares[field] = time.perf_counter() - start
    for _ in range(runs):
        read()
    unobservable = {f: v.source for f, v in fields.items() if v.provenance.value != "observed"}
    return {
        "model": name,
        "layers": len(layers),
        "rotary": sorted({type(m.rotary_emb).__name__ for m in modules.values() if hasattr(m, "rotary_emb")}),
        "positions": fields["rope"].value["positions"] if not unobservable.get("rope") else None,
        "first_s": times[0],
        "median_s": statistics.median(times[1:]),
        "field_s": shares,
        "record_bytes": len(json.dumps({f: v.value for f, v in fields.items()})),
        "unobservable": unobservable,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("vllm_behaviour: vLLM is not installed in this venv (lane vllm's venv has it)", file=sys.stderr)
        return 2
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch threads: {torch.get_num_threads()}, load average {load:.1f}; target {TARGET_S:.1f} s per worker")
    print(f"{'model':<14} {'layers':>6} {'first':>8} {'median':>8}  rope / mask / softmax (again)  bytes  rotary")
    failed = False
    for name, config in MODELS.items():
        row = measure(name, config, args.runs)
        shares = " / ".join(f"{row['field_s'][f] * 1000:.1f}" for f in ("rope", "mask", "softmax"))
        print(
            f"{name:<14} {row['layers']:>6} {row['first_s'] * 1000:>6.0f}ms {row['median_s'] * 1000:>6.0f}ms  "
            f"{shares + ' ms':<33} {row['record_bytes']:>6}  {', '.join(row['rotary'])} at {row['positions']}"
        )
        for field, why in row["unobservable"].items():
            print(f"  {field} unobservable: {why}")
        failed |= bool(row["unobservable"]) or row["first_s"] > TARGET_S
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
