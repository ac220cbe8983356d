"""Arbitrary values at the backend and precision keys: never a traceback, never silently accepted."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.preflight.backend import BACKEND_NAMES
from nemo_rl_attn_align.preflight.facts import PRECISIONS
from nemo_rl_attn_align.preflight.plan import build_plan
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.errors import Severity, UsageError

from .conftest import EXAMPLES

BASE = load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(BACKEND_NAMES + PRECISIONS + ("Flash", "FLASH", "flash_attn", " flash", "bf16", "fp32", "")),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _plan_with(backend=..., precision=...):
    cfg = copy.deepcopy(BASE)
    if backend is not ...:
        cfg["policy"]["megatron_cfg"]["attention_backend"] = backend
    if precision is not ...:
        cfg["policy"]["precision"] = precision
        cfg["policy"]["megatron_cfg"]["pipeline_dtype"] = "bfloat16"
    return build_plan(read_recipe_facts(cfg, {}))


def _keys(plan, severity=None):
    return {f.key for f in plan.findings if severity is None or f.severity is severity}


@given(values)
def test_any_backend_value_is_accepted_only_when_exactly_valid(value):
    plan = _plan_with(backend=value)
    key = "policy.megatron_cfg.attention_backend"
    if isinstance(value, str) and value in BACKEND_NAMES:
        assert key not in _keys(plan) and plan.effective == value
    elif value is None:
        assert key in _keys(plan, Severity.WARNING) and plan.effective == "auto"
    else:
        assert key in _keys(plan, Severity.ERROR) and not plan.ok and plan.effective is None


@given(values)
def test_any_precision_value_is_accepted_only_when_exactly_valid(value):
    plan = _plan_with(precision=value)
    if isinstance(value, str) and value in PRECISIONS:
        assert plan.precision == value
        assert ("policy.precision" in _keys(plan, Severity.ERROR)) == (value == "float32")  # flash + fp32
    else:
        assert "policy.precision" in _keys(plan, Severity.ERROR) and not plan.ok


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
def test_values_written_to_real_yaml_files(tmp_path_factory, value):
    """Through a real file: OmegaConf's typing of the value, then the rules."""
    path = tmp_path_factory.mktemp("p") / "c.yaml"
    child = {
        "defaults": str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml"),
        "policy": {"megatron_cfg": {"attention_backend": value}},
    }
    try:
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(child)))
    except Exception:  # a value OmegaConf itself cannot hold (e.g. odd keys): nothing to test
        return
    try:
        plan = build_plan(read_recipe_facts(load_config(path), {}))
    except UsageError:
        return  # e.g. a string that is an interpolation which cannot resolve
    loaded = load_config(path)["policy"]["megatron_cfg"]["attention_backend"]
    _assert_verdict(plan, loaded)


def _assert_verdict(plan, value):
    backend_codes = [f.code for f in plan.findings if f.code.startswith("ATTN_BACKEND_")]
    if isinstance(value, str) and value in BACKEND_NAMES:
        assert backend_codes == [] and plan.effective == value
    elif value is None:
        assert backend_codes == ["ATTN_BACKEND_NULL"] and plan.effective == "auto"
    else:
        assert backend_codes == ["ATTN_BACKEND_INVALID"] and not plan.ok and plan.effective is None


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=20))
def test_any_override_text_is_usage_error_or_checked(text):
    try:
        plan = build_plan(
            read_recipe_facts(
                load_config(
                    EXAMPLES / "grpo_math_1B_megatron_flash.yaml", [f"++policy.megatron_cfg.attention_backend={text}"]
                ),
                {},
            )
        )
    except UsageError as err:
        assert "\n" not in str(err)
        return
    _assert_verdict(plan, plan.requested)
