"""Valid contract values for the contract, binding and report tests, and hypothesis strategies.

``SAMPLES[name]`` holds two different valid values of every field: the first is what
``full_contract`` uses, the second is what a table-driven test changes one side to.
"""

from __future__ import annotations

from hypothesis import strategies as st

from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, FieldValue
from nemo_rl_attn_align.vocab.kinds import DTYPES
from nemo_rl_attn_align.vocab.schema import (
    DOWNCASTS,
    FIELDS,
    MERGE_RULES,
    MODES,
    REDUCTION_ORDERS,
    Provenance,
)
from tests import behaviour_samples

SAMPLES = {
    "architecture": ("Qwen2ForCausalLM", "LlamaForCausalLM"),
    "num_layers": (28, 32),
    "num_attention_heads": (12, 16),
    "num_query_groups": (2, 4),
    "head_dim": (128, 64),
    "head_dim_v": (128, 64),
    "attention_layers": ([0, 1], [1]),
    "softmax_type": ("vanilla", "learnable"),
    "attention_output_gate": (False, True),
    "mla": (
        None,
        {"q_lora_rank": None, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128},
    ),
    "rope": (behaviour_samples.ROPE, behaviour_samples.ROPE_INTERLEAVED),
    "mask": (behaviour_samples.MASK, behaviour_samples.MASK_WINDOWED),
    "softmax": (behaviour_samples.SOFTMAX, behaviour_samples.SOFTMAX_SOFTCAP),
    "softmax_scale": (0.0883883461356163, 0.125),  # fp32 values: the field holds what a kernel receives
    "causal": (True, False),
    "sliding_window": (None, 4096),
    "layer_windows": ([None, None], [4095, None]),
    "logit_softcapping": (None, 50.0),
    "rope_type": ("default", "yarn"),
    "rope_parameters": (
        {"theta": 1000000.0, "partial_rotary_factor": 1.0},
        {"theta": 10000.0, "partial_rotary_factor": 1.0},
    ),
    "vocab_size": (151936, 151665),
    "tokenizer": ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"),
    "batch_size": (512, 256),
    "merge_rule": ("online_softmax_lse", "full_softmax"),
    "reduction_order": ("kv_index", "split_kv"),
    "acc_dtype": ("fp32", "bf16"),
    "downcast": ("final_write", "per_partial"),
    "dtype": ("bf16", "fp32"),
    "engine": ("megatron-te", "vllm"),
    "backend": ("FlashAttention", {"model.layers.0.self_attn.attn": "FLASH_ATTN"}),
    "reduction_engine": ("single_kernel", "te_cp_p2p"),
    "split_kv_policy": ("none", "heuristic"),
    "kv_page_size": (None, 16),
    "kv_cache_dtype": (None, "auto"),
    "chunked_prefill_chunk": (None, 8192),
    "prefix_caching": (None, True),
    "cp_size": (1, 2),
    "decode_cp_size": (None, 2),
    "cp_layout": ("none", "load_balanced"),
    "cp_comm_type": (None, "p2p"),
    "tp_size": (1, 2),
    "mode": ("prefill", "chunked_prefill+decode"),
    "rope_fusion": (True, None),
    "physical_batch": (4, 256),
    "batch_invariant": (False, True),
    "deterministic": (False, None),
    "flash_attention_version": (2, 3),
    "gpu": ("sm90", "sm100"),
    "versions": ({"torch": "2.13.0", "megatron.core": "0.16.1"}, {"torch": "2.13.0", "vllm": "0.33.0"}),
}

#: The mandate the first sample values meet exactly.
MANDATE_OF_SAMPLES = {
    name: SAMPLES[name][0] for name in ("merge_rule", "reduction_order", "acc_dtype", "downcast", "dtype")
}


def full_contract(
    side: str = "training", worker_id: str = "w0", provenance: Provenance = Provenance.OBSERVED, **changes: FieldValue
) -> AttentionContract:
    """A contract with every field at its first sample value, then ``changes`` applied."""
    b = ContractBuilder(side, worker_id)
    for name, (value, _) in SAMPLES.items():
        b.set(name, FieldValue(value, provenance, f"sample {name}"))
    for name, fv in changes.items():
        b.set(name, fv)
    return b.build()


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False, allow_infinity=False), _text
)
_json = st.recursive(
    _json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=6
)
_pos = st.integers(1, 2**40)

_BY_NAME = {
    "rope": behaviour_samples.rope_strategy(),
    "mask": behaviour_samples.mask_strategy(),
    "softmax": behaviour_samples.softmax_strategy(),
    "softmax_scale": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "causal": st.booleans(),
    "sliding_window": st.one_of(st.none(), st.integers(0, 2**31)),
    "layer_windows": st.lists(st.one_of(st.none(), st.integers(0, 2**31)), min_size=1, max_size=4),
    "attention_layers": st.lists(st.integers(0, 2**20), max_size=6, unique=True).map(sorted),
    "softmax_type": st.sampled_from(("vanilla", "off-by-one", "learnable")),
    "attention_output_gate": st.booleans(),
    "mla": st.one_of(st.none(), st.dictionaries(_text, _json, max_size=4)),
    "logit_softcapping": st.one_of(st.none(), st.floats(min_value=0.125, max_value=1024.0, width=32)),
    "rope_parameters": st.dictionaries(_text, _json, max_size=4),
    "gpu": st.one_of(st.none(), _text),
    "versions": st.dictionaries(_text, _json, max_size=4),
    "merge_rule": st.sampled_from(MERGE_RULES),
    "reduction_order": st.sampled_from(REDUCTION_ORDERS),
    "acc_dtype": st.sampled_from(DTYPES),
    "downcast": st.sampled_from(DOWNCASTS),
    "dtype": st.sampled_from(DTYPES),
    "backend": st.one_of(_text, st.dictionaries(_text, _text, max_size=3)),
    "split_kv_policy": st.one_of(
        st.sampled_from(("none", "heuristic")),
        st.builds(lambda k, n: f"{k}:{n}", st.sampled_from(("fixed_count", "fixed_size")), _pos),
    ),
    "kv_cache_dtype": st.one_of(st.none(), _text),
    "prefix_caching": st.one_of(st.none(), st.booleans()),
    "cp_layout": st.sampled_from(("none", "load_balanced", "contiguous")),
    "cp_comm_type": st.sampled_from((None, "p2p", "all_gather", "a2a", "a2a+p2p")),
    "mode": st.sampled_from(MODES),
    "rope_fusion": st.one_of(st.none(), st.booleans()),
    "batch_invariant": st.one_of(st.none(), st.booleans()),
    "deterministic": st.one_of(st.none(), st.booleans()),
}


def value_strategy(name: str):
    """Valid values of field ``name`` (ints where the field is an int, ``None`` where nullable)."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    spec = next(s for s in FIELDS if s.name == name)
    base = _text if name in ("architecture", "rope_type", "tokenizer", "engine", "reduction_engine") else _pos
    return st.one_of(st.none(), base) if spec.nullable else base


@st.composite
def field_values(draw, name: str, known_only: bool = False):
    provenances = [Provenance.OBSERVED, Provenance.CONFIGURED] if known_only else list(Provenance)
    provenance = draw(st.sampled_from(provenances))
    source = draw(st.text(max_size=8))
    if provenance is Provenance.PENDING:
        return FieldValue(None, provenance, source)
    if provenance is Provenance.UNOBSERVABLE and draw(st.booleans()):
        return FieldValue(None, provenance, source)
    return FieldValue(draw(value_strategy(name)), provenance, source)


@st.composite
def contracts(draw, side: str = "training", known_only: bool = False, base: AttentionContract = None):
    """Random valid contracts; with ``base``, each field is either ``base``'s or a fresh draw."""
    fields = {}
    for spec in FIELDS:
        if base is not None and draw(st.booleans()):
            fields[spec.name] = base[spec.name]
        else:
            fields[spec.name] = draw(field_values(spec.name, known_only))
    worker = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:/ ", min_size=1, max_size=10))
    return AttentionContract(side, worker, fields)
