"""Binding: identity equal bit for bit, semantic equal to each other and the mandate, recorded listed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_attn_align.binding.binding import Status, Verdict, bind, same_value
from nemo_rl_attn_align.binding.determinism import compare
from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.binding.profiles import PROFILES
from nemo_rl_attn_align.contract.contract import FieldValue
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS
from nemo_rl_attn_align.vocab.codes import Code, Kind, codes_of
from nemo_rl_attn_align.vocab.errors import Severity
from nemo_rl_attn_align.vocab.kinds import DTYPES
from nemo_rl_attn_align.vocab.mandate import Mandate
from nemo_rl_attn_align.vocab.schema import (
    DOWNCASTS,
    FIELD_NAMES,
    FIELDS,
    MERGE_RULES,
    REDUCTION_ORDERS,
    ContractError,
    Provenance,
    Tier,
    field_spec,
    fields_of,
)
from tests.contract_samples import MANDATE_OF_SAMPLES, SAMPLES, contracts, full_contract

MANDATE = Mandate(**MANDATE_OF_SAMPLES)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"


_SAME = object()


#: Behaviour fields as an engine that offers no readback of its modules records them.
UNMEASURED = {name: FieldValue.unobservable(None, "not measured") for name in BEHAVIOUR_FIELDS}
#: The configuration fields a behaviour field explains.
EXPLAINED = [spec.name for spec in FIELDS if spec.explained_by]


def _pair(field=None, training=_SAME, rollout=_SAME, provenance=Provenance.OBSERVED, measured=True):
    """Two full contracts, ``field`` set to ``training`` / ``rollout`` where given (``measured``
    false: no behaviour field recorded, as by a host without module readback)."""
    base = {} if measured else dict(UNMEASURED)
    changes_t = {**base, **({field: FieldValue(training, provenance)} if training is not _SAME else {})}
    changes_r = {**base, **({field: FieldValue(rollout, provenance)} if rollout is not _SAME else {})}
    return full_contract("training", "policy-0", **changes_t), full_contract("rollout", "vllm-0", **changes_r)


def test_identical_sides_under_their_mandate_pass_and_are_comparable():
    report = bind(*_pair(), MANDATE)
    assert report.verdict is Verdict.PASS and report.passed and report.comparable
    assert {r.status for r in report.results} == {Status.MATCH}
    assert report.findings() == []


@pytest.mark.parametrize("name", fields_of(Tier.IDENTITY))
def test_a_difference_in_any_identity_field_fails(name):
    report = bind(*_pair(name, rollout=SAMPLES[name][1], measured=name in BEHAVIOUR_FIELDS), MANDATE)
    assert report.verdict is Verdict.FAIL and not report.passed
    assert report.comparable
    result = report.result(name)
    code = Code.ATTN_BEHAVIOUR_MISMATCH if name in BEHAVIOUR_FIELDS else Code.ATTN_IDENTITY_MISMATCH
    assert (result.status, result.code) == (Status.MISMATCH, code)
    assert [r.name for r in report.with_status(Status.MISMATCH)] == [name]
    (finding,) = [f for f in report.findings() if f.severity is Severity.ERROR]
    assert finding.key == f"contract.identity.{name}" and finding.fix


@pytest.mark.parametrize("name", EXPLAINED)
def test_a_configuration_field_explains_its_measured_behaviour_and_binds_without_it(name):
    """Where its behaviour field was measured on both sides, a configuration field that differs is
    listed as the explanation (the behaviour decides); where it was not, it binds as identity."""
    report = bind(*_pair(name, rollout=SAMPLES[name][1]), MANDATE)
    result = report.result(name)
    assert (result.status, result.code) == (Status.DIFFERENT, Code.ATTN_EXPLAINED_DIFFERENCE)
    assert result.explained_by == field_spec(name).explained_by and not result.binds
    assert report.verdict is Verdict.PASS and report.to_dict()["fields"][list(FIELD_NAMES).index(name)]["explained_by"]
    no_readback = full_contract("rollout", "vllm-0", **{name: FieldValue.unobservable(None, "no readback")})
    unknown = bind(full_contract("training", "policy-0"), no_readback, MANDATE)
    assert unknown.result(name).status is Status.NOT_COMPARABLE and unknown.verdict is Verdict.PASS


def test_a_behaviour_mismatch_names_the_layer_and_position_and_what_the_configuration_read():
    t, r = _pair("mask", rollout=SAMPLES["mask"][1])
    t = t.replace(layer_windows=FieldValue.observed([None, None]))
    r = r.replace(layer_windows=FieldValue.observed([4095, None]))
    result = bind(t, r, MANDATE).result("mask")
    assert result.status is Status.MISMATCH and result.code is Code.ATTN_BEHAVIOUR_MISMATCH
    assert "layer 0: from query position 4096 on" in result.message
    assert "training kernel sees every earlier token, the rollout kernel 4096 tokens" in result.message
    assert (
        "configuration read: " in result.message
        and "layer_windows training [None, None], rollout [4095, None]" in result.message
    )
    assert "causal True on both sides" in result.message
    assert "layers" in result.fix


@pytest.mark.parametrize("name", fields_of(Tier.RECORDED))
def test_a_difference_in_any_recorded_field_passes_and_is_listed(name):
    report = bind(*_pair(name, rollout=SAMPLES[name][1]), MANDATE)
    assert report.verdict is Verdict.PASS and report.passed and report.comparable
    result = report.result(name)
    assert (result.status, result.code) == (Status.DIFFERENT, Code.ATTN_RECORDED_DIFFERENCE)
    (finding,) = report.findings()
    assert finding.severity is Severity.INFO and finding.code == Code.ATTN_RECORDED_DIFFERENCE.value
    assert name in report.summary_line()


SEMANTIC_NO_DTYPE = [n for n in fields_of(Tier.SEMANTIC) if n != "dtype"]


@pytest.mark.parametrize("name", fields_of(Tier.SEMANTIC))
def test_semantic_sides_that_differ_fail(name):
    report = bind(*_pair(name, rollout=SAMPLES[name][1]), None)  # no mandate: the sides alone must agree
    assert report.verdict is Verdict.FAIL
    assert report.result(name).code is Code.ATTN_SEMANTIC_SIDES_DIFFER


@pytest.mark.parametrize("side", ["training", "rollout"])
@pytest.mark.parametrize("name", fields_of(Tier.SEMANTIC))
def test_semantic_against_the_mandate_each_side(name, side):
    other = SAMPLES[name][1]
    report = bind(*_pair(name, **{side: other}), MANDATE)
    result = report.result(name)
    assert report.verdict is Verdict.FAIL and result.code is Code.ATTN_SEMANTIC_MANDATE
    assert f"{side} {other!r}" in result.message and result.demand == SAMPLES[name][0]


@pytest.mark.parametrize("name", fields_of(Tier.SEMANTIC))
def test_both_sides_agreeing_against_the_mandate_fail_and_meeting_a_relaxed_one_pass(name):
    other = SAMPLES[name][1]
    agreeing = _pair(name, training=other, rollout=other)
    assert bind(*agreeing, MANDATE).result(name).code is Code.ATTN_SEMANTIC_MANDATE
    relaxed = Mandate(**{**MANDATE_OF_SAMPLES, name: None})
    assert bind(*agreeing, relaxed).verdict is Verdict.PASS
    demanding_other = Mandate(**{**MANDATE_OF_SAMPLES, name: other})
    assert bind(*agreeing, demanding_other).verdict is Verdict.PASS


@pytest.mark.parametrize("name", fields_of(Tier.SEMANTIC))
def test_a_known_side_breaking_the_mandate_fails_even_when_the_other_is_unobservable(name):
    training = full_contract("training", "t", **{name: FieldValue.observed(SAMPLES[name][1])})
    rollout = full_contract("rollout", "r", **{name: FieldValue.unobservable(SAMPLES[name][0])})
    assert bind(training, rollout, MANDATE).result(name).code is Code.ATTN_SEMANTIC_MANDATE


def test_dtype_difference_fails_unless_allowed():
    training, rollout = _pair("dtype", training="fp32", rollout="bf16")
    plain = bind(training, rollout, Mandate(**{**MANDATE_OF_SAMPLES, "dtype": "fp32"}))
    assert plain.verdict is Verdict.FAIL
    assert "allow_dtype_difference" in plain.findings()[0].fix
    allowed = bind(training, rollout, Mandate(**{**MANDATE_OF_SAMPLES, "dtype": "fp32"}), allow_dtype_difference=True)
    result = allowed.result("dtype")
    assert allowed.verdict is Verdict.PASS and (result.status, result.code) == (
        Status.ALLOWED,
        Code.ATTN_DTYPE_DIFFERENCE_ALLOWED,
    )
    # allowed also covers two sides that agree with each other but not with the mandate
    both_fp32 = _pair("dtype", training="fp32", rollout="fp32")
    assert bind(*both_fp32, MANDATE, allow_dtype_difference=True).result("dtype").status is Status.ALLOWED
    assert bind(*_pair(), MANDATE, allow_dtype_difference=True).result("dtype").status is Status.MATCH
    # the flag relaxes dtype only
    other = _pair("acc_dtype", rollout="bf16")
    assert bind(*other, MANDATE, allow_dtype_difference=True).verdict is Verdict.FAIL


@pytest.mark.parametrize(
    "provenance,code", [(Provenance.UNOBSERVABLE, Code.ATTN_UNOBSERVABLE), (Provenance.PENDING, Code.ATTN_PENDING)]
)
@pytest.mark.parametrize("name", fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC))
def test_an_unknown_field_is_never_a_match(name, provenance, code):
    value = None if provenance is Provenance.PENDING else SAMPLES[name][0]  # unobservable keeps the equal request
    rollout = full_contract("rollout", "r", **{**UNMEASURED, name: FieldValue(value, provenance, "no readback")})
    unmeasured_other = {field: fv for field, fv in UNMEASURED.items() if field != name}
    report = bind(full_contract(**unmeasured_other), rollout, MANDATE)
    result = report.result(name)
    assert (result.status, result.code) == (Status.NOT_COMPARABLE, code)
    assert "rollout is" in result.message
    if name in BEHAVIOUR_FIELDS:  # unmeasured, the configuration fields bind on their own, as before
        assert report.passed and report.comparable and report.verdict is Verdict.PASS and not result.binds
    else:
        assert report.passed and not report.comparable and report.verdict is Verdict.INCOMPARABLE


def test_unknown_recorded_fields_do_not_make_the_binding_incomparable():
    rollout = full_contract("rollout", "r", versions=FieldValue.unobservable())
    report = bind(full_contract(), rollout, MANDATE)
    assert report.result("versions").status is Status.NOT_COMPARABLE
    assert report.comparable and report.verdict is Verdict.PASS


def test_blocking_determinism_fails_the_binding_recorded_does_not():
    megatron, _ = PROFILES["megatron-deterministic"].apply({})
    vllm, _ = PROFILES["vllm-batch-invariant"].apply({})
    blocking = compare(probe(megatron, torch_module=False), probe(vllm, torch_module=False), "allreduce")
    report = bind(*_pair(), MANDATE, determinism=blocking)
    assert report.verdict is Verdict.FAIL and report.comparable
    assert {f.code for f in report.findings() if f.severity is Severity.ERROR} == {Code.DET_BLOCKING_MISMATCH.value}
    # no collective reduces the compared tensor (TP=1 on both sides): NCCL_ALGO/PROTO are only recorded
    recorded_only = compare(probe(megatron, torch_module=False), probe(vllm, torch_module=False), None)
    report = bind(*_pair(), MANDATE, determinism=recorded_only)
    assert report.verdict is Verdict.PASS
    assert recorded_only.entry("NCCL_ALGO").status.value == "different"
    assert any(f.code == Code.DET_RECORDED_DIFFERENCE.value for f in report.findings())


def test_same_value_is_exact():
    assert same_value(1, 1.0) and same_value({"a": [1, 2.5]}, {"a": [1, 2.5]})
    assert not same_value(True, 1) and not same_value(0.0, -0.0) and not same_value(None, "null")
    assert not same_value(0.1 + 0.2, 0.3) and not same_value([1], [1, 1]) and not same_value({"a": 1}, {"b": 1})
    assert not same_value(0.08838834764831845, 0.08838834764831845 + 2**-56)


def test_mandate_validates_and_covers_the_semantic_tier():
    assert tuple(Mandate().to_dict()) == fields_of(Tier.SEMANTIC)
    assert Mandate(dtype="bfloat16").dtype == "bf16"
    assert Mandate.from_dict(Mandate().to_dict()) == Mandate()
    with pytest.raises(ContractError, match="mandate field reduction_order"):
        Mandate(reduction_order="sorted")


# --- properties --------------------------------------------------------------------------------

mandates = st.builds(
    Mandate,
    merge_rule=st.one_of(st.none(), st.sampled_from(MERGE_RULES)),
    reduction_order=st.one_of(st.none(), st.sampled_from(REDUCTION_ORDERS)),
    acc_dtype=st.one_of(st.none(), st.sampled_from(DTYPES)),
    downcast=st.one_of(st.none(), st.sampled_from(DOWNCASTS)),
    dtype=st.one_of(st.none(), st.sampled_from(DTYPES)),
)


@settings(max_examples=100, deadline=None)
@given(contracts(), st.booleans())
def test_a_contract_bound_to_itself_passes(contract, allow):
    report = bind(contract, contract, None, allow_dtype_difference=allow)
    assert report.passed
    measured = {n for n in BEHAVIOUR_FIELDS if contract[n].known}
    binding = [
        n
        for n in fields_of(Tier.IDENTITY) + fields_of(Tier.SEMANTIC)
        if field_spec(n).explained_by not in measured and n not in BEHAVIOUR_FIELDS
    ]
    known = all(contract[n].known for n in binding)
    assert report.comparable is known
    assert report.verdict is (Verdict.PASS if known else Verdict.INCOMPARABLE)
    own = Mandate(**{n: contract.value(n) if contract[n].known else None for n in fields_of(Tier.SEMANTIC)})
    assert bind(contract, contract, own, allow_dtype_difference=allow).passed


@st.composite
def two_contracts(draw):
    a = draw(contracts(side="training"))
    return a, draw(contracts(side="rollout", base=a))


@settings(max_examples=150, deadline=None)
@given(two_contracts(), mandates, st.booleans())
def test_the_verdict_does_not_depend_on_argument_order(pair, mandate, allow):
    a, b = pair
    ab, ba = bind(a, b, mandate, allow_dtype_difference=allow), bind(b, a, mandate, allow_dtype_difference=allow)
    assert (ab.verdict, ab.passed, ab.comparable) == (ba.verdict, ba.passed, ba.comparable)
    assert [(r.name, r.status, r.code) for r in ab.results] == [(r.name, r.status, r.code) for r in ba.results]


@settings(max_examples=100, deadline=None)
@given(two_contracts(), mandates, st.booleans())
def test_the_verdict_follows_the_field_statuses(pair, mandate, allow):
    report = bind(*pair, mandate, allow_dtype_difference=allow)
    mismatched = any(r.status is Status.MISMATCH for r in report.results)
    assert report.passed is not mismatched
    assert all(r.tier is not Tier.RECORDED for r in report.with_status(Status.MISMATCH))
    assert all(not r.binds for r in report.with_status(Status.DIFFERENT))
    assert all(r.name == "dtype" for r in report.with_status(Status.ALLOWED))
    for r in report.with_status(Status.MATCH):
        assert r.training.known and r.rollout.known  # a match is only ever claimed on known values
    data = report.to_dict()
    assert data["verdict"] == report.verdict.value and len(data["fields"]) == len(report.results)


def test_every_code_is_documented_in_the_report_schema():
    text = DOCS.read_text()
    for code in codes_of(Kind.BINDING, Kind.DETERMINISM):
        assert f"| `{code.value}` | {code.severity_text} | {code.summary} |" in text, code.value
    assert len({c.value for c in Code}) == len(Code)
