"""The attention contract: its field list, validation, provenance, and an exact JSON round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.contract.contract import AttentionContract, ContractBuilder, FieldValue
from nemo_rl_attn_align.vocab.kinds import normalize_dtype
from nemo_rl_attn_align.vocab.schema import (
    CONTRACT_SCHEMA_VERSION,
    FIELD_NAMES,
    FIELDS,
    FIELDS_ADDED,
    ContractError,
    Provenance,
    Tier,
    field_spec,
    fields_of,
)
from tests.contract_samples import SAMPLES, contracts, full_contract


def test_every_field_has_a_tier_a_doc_and_two_sample_values():
    assert len(set(FIELD_NAMES)) == len(FIELDS)
    assert set(SAMPLES) == set(FIELD_NAMES)
    for spec in FIELDS:
        assert spec.doc, spec.name
        a, b = SAMPLES[spec.name]
        assert spec.validate(a) == a and spec.validate(b) == b and a != b
    assert fields_of(Tier.SEMANTIC) == ("merge_rule", "reduction_order", "acc_dtype", "downcast", "dtype")
    assert {
        "architecture",
        "num_layers",
        "num_attention_heads",
        "num_query_groups",
        "head_dim",
        "head_dim_v",
        "attention_layers",
        "softmax_type",
        "mla",
        "attention_output_gate",
        "rope",
        "mask",
        "softmax",
        "softmax_scale",
        "causal",
        "sliding_window",
        "layer_windows",
        "logit_softcapping",
        "rope_type",
        "rope_parameters",
        "vocab_size",
        "tokenizer",
        "batch_size",
    } == set(fields_of(Tier.IDENTITY))


@pytest.mark.parametrize("version", range(1, CONTRACT_SCHEMA_VERSION))
def test_a_record_of_an_earlier_schema_loads_with_the_newer_fields_unobservable(version):
    data = full_contract().to_dict()
    data["schema_version"] = version
    newer = [name for since, names in FIELDS_ADDED.items() if since > version for name in names]
    assert "rope" in newer and (version > 2) is ("gpu" not in newer) and (version > 1) is ("mla" not in newer)
    for name in newer:
        del data["fields"][name]
    loaded = AttentionContract.from_dict(data)
    assert loaded.schema_version == CONTRACT_SCHEMA_VERSION
    for name in newer:
        assert loaded[name].provenance is Provenance.UNOBSERVABLE
        assert loaded[name].source == f"not recorded (contract schema {version})"
    with pytest.raises(ContractError):
        AttentionContract.from_dict({**data, "schema_version": CONTRACT_SCHEMA_VERSION + 1})


def test_identity_and_semantic_fields_name_a_fix():
    for name in fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC):
        assert field_spec(name).fix, name


# A wrong value for every kind of field: each must be refused naming the field.
BAD_VALUES = {
    "rope": [{}, {"positions": [1], "kinds": [], "layers": [[0, 0]]}, {"positions": [2], "kinds": [], "layers": []}],
    "mask": [[], {"kinds": [{"causal": True, "window": -1}], "layers": [[0, 0]]}],
    "softmax": [{"kinds": [{"scale": 0.1, "softcap": None, "sinks": "yes"}], "layers": [[0, 0]]}],
    "architecture": [""],
    "num_layers": [0, -1, True, 2.0, "28"],
    "num_attention_heads": [0],
    "num_query_groups": [None],
    "head_dim": [1.5],
    "softmax_scale": [float("nan"), float("inf"), "0.1", True],
    "causal": [1, "true"],
    "sliding_window": [-1, 1.0],
    "layer_windows": [[], [-1], 4096, [1.0]],
    "logit_softcapping": [0, -30.0, "50"],
    "rope_type": [3],
    "rope_parameters": [[1], "x", {"t": float("nan")}, {1: 2}],
    "vocab_size": [None],
    "tokenizer": [None, ""],
    "batch_size": [0],
    "merge_rule": ["online", None],
    "reduction_order": ["kvindex", "KV_INDEX"],
    "acc_dtype": ["float64", "int8"],
    "downcast": ["final"],
    "dtype": ["bfloat17", None],
    "engine": [None],
    "backend": [{"layer": 3}, 5],
    "reduction_engine": [""],
    "split_kv_policy": ["fixed_count:0", "auto", "fixed_size:x"],
    "kv_page_size": [0],
    "kv_cache_dtype": [""],
    "chunked_prefill_chunk": [-8],
    "prefix_caching": ["yes"],
    "cp_size": [0],
    "decode_cp_size": [0],
    "cp_layout": ["zigzag"],
    "cp_comm_type": ["ring"],
    "tp_size": [None],
    "mode": ["decode"],
    "rope_fusion": ["on"],
    "physical_batch": [0],
    "batch_invariant": [1],
    "deterministic": ["no"],
    "flash_attention_version": [0],
    "versions": ["2.13", {"torch": object()}],
    "gpu": ["", 90],
    "head_dim_v": [0],
    "attention_layers": [[1, 0], [-1], "0,1"],
    "softmax_type": ["sinks"],
    "mla": ["512"],
    "attention_output_gate": [1],
}


def test_bad_values_cover_every_field():
    assert set(BAD_VALUES) == set(FIELD_NAMES)


@pytest.mark.parametrize("name,bad", [(n, v) for n, vs in BAD_VALUES.items() for v in vs])
def test_a_bad_value_is_refused_naming_the_field(name, bad):
    with pytest.raises(ContractError, match=rf"field {name}\b"):
        ContractBuilder("training", "w").observed(name, bad)


def test_unknown_field_and_choice_get_a_did_you_mean():
    with pytest.raises(ContractError, match="did you mean 'num_layers'"):
        ContractBuilder("training", "w").observed("num_layer", 3)
    with pytest.raises(ContractError, match="did you mean 'kv_index'"):
        ContractBuilder("training", "w").configured("reduction_order", "kv-index")


@pytest.mark.parametrize(
    "spelling,canonical",
    [
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("BFloat16", "bf16"),
        ("float32", "fp32"),
        ("fp32", "fp32"),
        ("float", "fp32"),
        ("half", "fp16"),
        ("float16", "fp16"),
        ("fp8_e4m3", "fp8"),
    ],
)
def test_dtype_spellings_normalize(spelling, canonical):
    assert normalize_dtype(spelling) == canonical


def test_real_torch_dtypes_normalize():
    torch = pytest.importorskip("torch")
    assert [normalize_dtype(d) for d in (torch.bfloat16, torch.float32, torch.float16)] == ["bf16", "fp32", "fp16"]
    c = ContractBuilder("training", "w").observed("dtype", torch.bfloat16).build()
    assert c.value("dtype") == "bf16"


def test_unset_fields_are_unobservable_never_a_value():
    c = ContractBuilder("rollout", "vllm-0").observed("tp_size", 2).build()
    assert c["tp_size"] == FieldValue.observed(2)
    unset = [fv for name, fv in c if name != "tp_size"]
    assert unset and all(fv.provenance is Provenance.UNOBSERVABLE and fv.value is None for fv in unset)
    assert all(not fv.known for fv in unset)
    pending = ContractBuilder("rollout", "vllm-0").build(unset=Provenance.PENDING)
    assert {fv.provenance for _, fv in pending} == {Provenance.PENDING}
    with pytest.raises(ContractError):
        ContractBuilder("rollout", "vllm-0").build(unset=Provenance.OBSERVED)


def test_provenance_rules():
    b = ContractBuilder("training", "w")
    with pytest.raises(ContractError, match="pending field has no value"):
        b.set("num_layers", FieldValue(28, Provenance.PENDING))
    with pytest.raises(ContractError, match="observed needs a value"):
        b.observed("num_layers", None)
    b.unobservable("split_kv_policy", "none", "TE exposes no split count")  # the requested value is kept ...
    assert b.build()["split_kv_policy"].value == "none"  # ... but never counts as known
    assert not b.build()["split_kv_policy"].known
    with pytest.raises(ContractError, match="field split_kv_policy"):
        b.unobservable("split_kv_policy", "sometimes")
    b.configured("kv_page_size", None, "no paged KV")  # null is a value of nullable fields
    assert b.build()["kv_page_size"].known


def test_contract_rejects_wrong_side_missing_fields_and_schema_version():
    c = full_contract()
    with pytest.raises(ContractError, match="side"):
        AttentionContract("trainer", "w", c.fields)
    with pytest.raises(ContractError, match="lacks fields: num_layers"):
        AttentionContract("training", "w", {k: v for k, v in c.fields.items() if k != "num_layers"})
    data = c.to_dict()
    data["schema_version"] = CONTRACT_SCHEMA_VERSION + 1
    with pytest.raises(ContractError, match="schema_version"):
        AttentionContract.from_dict(data)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.update(extra=1), "unexpected"),
        (lambda d: d["fields"].update(num_layrs=d["fields"]["num_layers"]), "did you mean 'num_layers'"),
        (lambda d: d["fields"]["num_layers"].update(provenance="applied"), "provenance 'applied'"),
        (lambda d: d["fields"]["num_layers"].pop("source"), "value, provenance and source"),
        (lambda d: d["fields"]["num_layers"].update(value="28"), "field num_layers"),
        (lambda d: d.update(fields=[]), "fields must be a JSON object"),
    ],
)
def test_from_dict_refuses_anything_off_schema(mutate, match):
    data = json.loads(full_contract().to_json())
    mutate(data)
    with pytest.raises(ContractError, match=match):
        AttentionContract.from_dict(data)


def test_from_json_refuses_broken_json():
    with pytest.raises(ContractError, match="not valid JSON"):
        AttentionContract.from_json('{"side": ')


def _canonical(contract: AttentionContract) -> str:
    return json.dumps(contract.to_dict(), sort_keys=True)


@settings(max_examples=150, deadline=None)
@given(contracts(side="rollout"))
def test_json_round_trip_is_exact(contract):
    again = AttentionContract.from_json(contract.to_json())
    assert again == contract
    assert _canonical(again) == _canonical(contract)  # int stays int, float stays float, order kept
    assert list(again.fields) == list(FIELD_NAMES)


@settings(max_examples=50, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float_values_survive_bit_for_bit(x):
    c = full_contract(softmax_scale=FieldValue.observed(x))
    assert AttentionContract.from_json(c.to_json()).value("softmax_scale").hex() == float(x).hex()


def test_softmax_scale_is_compared_as_the_fp32_a_kernel_receives():
    """Megatron's 1/sqrt(d) and vLLM's d**-0.5 differ in the last fp64 bit for d=128 but are one fp32."""
    import math

    assert 1.0 / math.sqrt(128) != 128**-0.5
    a = full_contract(softmax_scale=FieldValue.observed(1.0 / math.sqrt(128)))
    b = full_contract(softmax_scale=FieldValue.observed(128**-0.5))
    assert a.value("softmax_scale") == b.value("softmax_scale") == 0.0883883461356163
    assert full_contract(softmax_scale=FieldValue.observed(0.125)).value("softmax_scale") == 0.125
    with pytest.raises(ContractError, match="32-bit float"):
        full_contract(softmax_scale=FieldValue.observed(1e300))


def test_replace_validates_and_keeps_the_rest():
    c = full_contract()
    d = c.replace(tp_size=FieldValue.observed(4))
    assert d.value("tp_size") == 4 and c.value("tp_size") == 1
    assert all(d[n] == c[n] for n in FIELD_NAMES if n != "tp_size")
    with pytest.raises(ContractError):
        c.replace(tp_size=FieldValue.observed(0))


def test_core_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        "import nemo_rl_attn_align.vocab.schema, nemo_rl_attn_align.binding.binding, "
        "nemo_rl_attn_align.binding.determinism\n"
        "import nemo_rl_attn_align.report.store, nemo_rl_attn_align.report.document\n"
        "import nemo_rl_attn_align.report.report_render, nemo_rl_attn_align.report.finalize\n"
        "import nemo_rl_attn_align.contract.contract_preview, nemo_rl_attn_align.cli.report\n"
        "heavy = ['torch', 'megatron', 'vllm', 'ray', 'pydantic', 'omegaconf', 'transformer_engine']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
