"""The ``attention_align:`` block: defaults, resolution from the config, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.config.settings import OnMismatch, load_settings
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.mandate import Mandate
from tests.conftest import EXAMPLES

BASE = {"policy": {"precision": "bfloat16"}, "logger": {"log_dir": "logs/run1"}}


def _load(block, base=BASE):
    return load_settings({**base, "attention_align": block})


def test_defaults():
    s = load_settings(BASE)
    assert (s.on_mismatch, s.allow_dtype_difference, s.strict) == (OnMismatch("error", "warn"), False, False)
    assert s.report_dir == "logs/run1/attention_align"
    assert s.mandate == Mandate(dtype="bf16")
    assert load_settings({**BASE, "attention_align": None}) == s


@pytest.mark.parametrize(
    "precision,dtype", [("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"), ("bf17", None), (None, None)]
)
def test_mandate_dtype_follows_policy_precision_unless_given(precision, dtype):
    s = load_settings({"policy": {"precision": precision}})
    assert s.mandate.dtype == dtype
    assert _load({"mandate": {"dtype": "float32"}}).mandate.dtype == "fp32"
    assert _load({"mandate": {"dtype": None}}).mandate.dtype is None  # explicit null: no demand


def test_report_dir_without_logger_and_explicit():
    assert load_settings({}).report_dir == "attention_align"
    assert _load({"report_dir": "/tmp/aa"}).report_dir == "/tmp/aa"


def test_every_setting_can_be_set():
    s = _load(
        {
            "on_mismatch": "error",
            "allow_dtype_difference": True,
            "strict": True,
            "mandate": {
                "reduction_order": "split_kv",
                "merge_rule": None,
                "acc_dtype": "float32",
                "downcast": "per_partial",
            },
        }
    )
    assert (s.on_mismatch, s.allow_dtype_difference, s.strict) == (OnMismatch("error", "error"), True, True)
    assert s.mandate == Mandate(
        merge_rule=None, reduction_order="split_kv", acc_dtype="fp32", downcast="per_partial", dtype="bf16"
    )


@pytest.mark.parametrize(
    "block,expected",
    [
        ({"on_mismach": "warn"}, ["attention_align.on_mismach", "did you mean attention_align.on_mismatch", "Fix:"]),
        (
            {"on_mismatch": "stop"},
            [
                "attention_align.on_mismatch='stop'",
                "Fix: set attention_align.on_mismatch to one of error, warn, record",
            ],
        ),
        ({"on_mismatch": "Warn"}, ["did you mean 'warn'"]),
        ({"on_mismatch": None}, ["attention_align.on_mismatch=None"]),
        (
            {"on_mismatch": {"identty": "warn"}},
            ["attention_align.on_mismatch=", "has no tier 'identty'", "identity: MODE"],
        ),
        ({"on_mismatch": {"semantic": "stop"}}, ["attention_align.on_mismatch=", "must be one of error, warn, record"]),
        ({"allow_dtype_difference": "yes"}, ["attention_align.allow_dtype_difference='yes'", "YAML boolean"]),
        ({"strict": 1}, ["attention_align.strict=1"]),
        ({"report_dir": ""}, ["attention_align.report_dir=''", "non-empty"]),
        ({"report_dir": 3}, ["attention_align.report_dir=3"]),
        ({"mandate": "kv_index"}, ["attention_align.mandate='kv_index'", "mapping"]),
        (
            {"mandate": {"reduction_ordr": "kv_index"}},
            ["attention_align.mandate.reduction_ordr", "did you mean attention_align.mandate.reduction_order"],
        ),
        (
            {"mandate": {"reduction_order": "kvindex"}},
            ["attention_align.mandate.reduction_order='kvindex'", "did you mean 'kv_index'", "or null for no demand"],
        ),
        ({"mandate": {"dtype": "bfloat17"}}, ["attention_align.mandate.dtype='bfloat17'", "fp32, bf16"]),
        ({"mandate": {"downcast": 3}}, ["attention_align.mandate.downcast=3"]),
    ],
)
def test_bad_values_raise_one_line_naming_key_value_and_fix(block, expected):
    with pytest.raises(UsageError) as err:
        _load(block)
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_several_errors_are_all_named_on_one_line():
    with pytest.raises(UsageError) as err:
        _load({"on_mismatch": "stop", "strict": "no"})
    assert "attention_align.on_mismatch" in str(err.value) and "attention_align.strict" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("block", [[1, 2], "warn", 3])
def test_a_block_that_is_not_a_mapping(block):
    with pytest.raises(UsageError, match=r"attention_align=.*must be a mapping"):
        _load(block)


def test_from_a_real_yaml_with_inheritance_interpolation_and_overrides(write_yaml):
    path = write_yaml(
        "run.yaml",
        f"""
        defaults: {EXAMPLES / "grpo_math_1B_megatron_flash.yaml"}
        logger:
          log_dir: logs/exp7
        attention_align:
          on_mismatch: record
          report_dir: ${{logger.log_dir}}/align
          mandate:
            reduction_order: split_kv
        """,
    )
    cfg = load_config(path, ["attention_align.on_mismatch=error", "++attention_align.allow_dtype_difference=true"])
    s = load_settings(cfg)
    assert (s.on_mismatch.text(), s.allow_dtype_difference, s.report_dir) == ("error", True, "logs/exp7/align")
    assert s.mandate.reduction_order == "split_kv" and s.mandate.dtype == "bf16"
    bad = load_config(path, ["attention_align.on_mismatch=abort"])
    with pytest.raises(UsageError, match=re.escape("attention_align.on_mismatch='abort'")):
        load_settings(bad)


def test_on_mismatch_is_per_tier_and_one_word_sets_both():
    """An identity mismatch stops the run by default, a semantic one warns; one word sets both tiers;
    a mapping sets the tiers it names."""
    assert _load({}).on_mismatch.to_dict() == {"identity": "error", "semantic": "warn"}
    assert _load({"on_mismatch": "warn"}).on_mismatch == OnMismatch("warn", "warn")
    per_tier = _load({"on_mismatch": {"semantic": "error"}}).on_mismatch
    assert per_tier == OnMismatch("error", "error") and per_tier.text() == "error"
    relaxed = _load({"on_mismatch": {"identity": "record"}}).on_mismatch
    assert relaxed.text() == "identity record, semantic warn"
    assert relaxed.applied(["semantic"]) == "warn" and relaxed.applied(["identity", "semantic"]) == "warn"
    assert OnMismatch().applied(["identity"]) == "error" and OnMismatch().applied([]) == "error"


def test_the_packaged_example_loads_with_defaults():
    s = load_settings(load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml"))
    assert s.report_dir == "logs/grpo_megatron_flash/attention_align" and s.on_mismatch == OnMismatch("error", "warn")


def test_settings_are_frozen():
    s = load_settings(BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.on_mismatch = "error"


def test_reading_the_settings_imports_no_validation_library():
    """The block is validated with the standard library: ``check`` and the driver hook pay no
    pydantic import (~70 ms)."""
    code = (
        "import sys\nfrom nemo_rl_attn_align.config.settings import OnMismatch, load_settings\n"
        "load_settings({'attention_align': {'on_mismatch': 'error', 'drift': {'heads': 2}}})\n"
        "print('pydantic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_to_dict_is_plain_json_and_replace_keeps_the_rest():
    s = load_settings(BASE)
    assert json.loads(json.dumps(s.to_dict()))["mandate"] == {
        "merge_rule": "online_softmax_lse",
        "reduction_order": "kv_index",
        "acc_dtype": "fp32",
        "downcast": "final_write",
        "dtype": "bf16",
    }
    changed = s.replace(strict=True)
    assert changed.strict and not s.strict and changed.mandate == s.mandate


def test_drift_block_is_validated():
    settings = load_settings({"attention_align": {"drift": {"heads": 32, "kv_heads": 8, "head_dim": 128, "window": 0}}})
    assert (settings.drift.heads, settings.drift.window, settings.drift.seq_len) == (32, 0, None)
    for bad, expected in (
        ({"heads": 0}, "attention_align.drift.heads=0"),
        ({"head": 8}, "did you mean attention_align.drift.heads"),
    ):
        with pytest.raises(UsageError) as info:
            load_settings({"attention_align": {"drift": bad}})
        assert expected in str(info.value) and "\n" not in str(info.value)
