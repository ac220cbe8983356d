"""``python -m tests.real_te.core_behaviour``: the mask and softmax ``hosts.megatron_behaviour`` reads
from megatron-core's ``TEDotProductAttention`` built on the real Transformer Engine Python (the one
first on ``PYTHONPATH``), for ``CASES``; prints one JSON line ``{"te": version, "read": [...]}``."""

from __future__ import annotations

import json
import types

from tests.real_te import harness
from tests.real_te.harness import Case, stand_ins

#: gpt-oss's windowed layer with learnable sinks; a full layer with a fixed zero sink; a plain one.
CASES = (
    Case(window=127, softmax="learnable", head_dim=64),
    Case(softmax="off-by-one"),
    Case(),
)


def read(case: Case) -> dict:
    """The ``mask`` and ``softmax`` fields of a one-layer model around the case's core attention."""
    from nemo_rl_attn_align.hosts import megatron_behaviour

    harness._parallel_state(case.cp)
    device = stand_ins.declared_device(case.gpu, flash_attn=case.flash_attn, flash_attn_3=case.flash_attn_3)
    with device, harness._environment(case):
        core = harness.build_core_attention(case)
    attention = types.SimpleNamespace(
        core_attention=core, config=core.config, hidden_size_per_attention_head=case.head_dim, layer_number=1
    )
    layer = types.SimpleNamespace(layer_number=1, self_attention=attention)
    fields, problems = megatron_behaviour.read(types.SimpleNamespace(decoder=types.SimpleNamespace(layers=[layer])))
    return {
        "problems": problems,
        **{
            name: [fields[name].provenance.value, fields[name].value, fields[name].source]
            for name in ("mask", "softmax")
        },
    }


if __name__ == "__main__":
    import transformer_engine

    print(json.dumps({"te": transformer_engine.__version__, "read": [read(case) for case in CASES]}))
