"""What reading the behaviour fields (``rope``, ``mask``, ``softmax``) costs a Megatron worker at start
(target, issue #38: at most 1 s for a 1B-shaped model on these CPUs; nothing per step).

Builds a 1B-shaped megatron-core GPTModel (16 layers, hidden 2048, 32 heads of 64, 8 query groups,
FFN 8192, vocab 128256; local layer spec) with its weights on the meta device (the reader touches
no weight; the rotary module's ``inv_freq`` is real, on the CPU), then times
``hosts.megatron_behaviour.read`` on it: the first call (what the worker's hook pays once, in a
fresh process) and the median of the next ``--runs``. The number of layers only matters through the
per-layer reads: ``--layers`` scales it.

    python benchmarks/behaviour_cost.py [--layers 16] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPE = {"hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 8, "ffn_hidden_size": 8192}
VOCAB = 128256


def build(layers: int):
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from nemo_rl_attn_align.probe.megatron_side import cpu_only, ensure_model_parallel

    ensure_model_parallel()
    config = TransformerConfig(
        num_layers=layers, **SHAPE, use_cpu_initialization=True, perform_initialization=False, bf16=True
    )
    with cpu_only(), torch.device("meta"):
        return GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=VOCAB,
            max_sequence_length=4096,
            position_embedding_type="rope",
            rotary_base=500000,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    model = build(args.layers)
    start = time.perf_counter()
    from nemo_rl_attn_align.hosts import megatron_behaviour

    fields, problems = megatron_behaviour.read(model)
    first = time.perf_counter() - start
    again = []
    for _ in range(args.runs):
        start = time.perf_counter()
        megatron_behaviour.read(model)
        again.append(time.perf_counter() - start)
    observed = [name for name, value in fields.items() if value.provenance.value == "observed"]
    print(
        f"{args.layers}-layer GPTModel (hidden {SHAPE['hidden_size']}, head_dim "
        f"{SHAPE['hidden_size'] // SHAPE['num_attention_heads']}): observed {', '.join(observed)}; problems {problems}"
    )
    median = statistics.median(again) * 1000
    print(f"first read (import included): {first * 1000:.1f} ms; next {args.runs}: median {median:.1f} ms")
    print(f"target: <= 1000 ms per worker -> {'met' if first <= 1.0 else 'NOT met'}")
    return 0 if len(observed) == 3 and first <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
