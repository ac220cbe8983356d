"""Config reading as NeMo-RL's recipes do it, with real OmegaConf and hydra-core on real files."""

from __future__ import annotations

import re

import pytest

from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.config.loader import get_path, load_config
from nemo_rl_attn_align.vocab.errors import UsageError
from tests.conftest import EXAMPLES


@pytest.mark.parametrize(
    "name", ["grpo_math_1B_megatron_flash.yaml", "grpo_math_1B_megatron_flash_mismatch.yaml", "sft_megatron_flash.yaml"]
)
def test_examples_load_and_interpolate(name):
    cfg = load_config(EXAMPLES / name)
    assert cfg["policy"]["megatron_cfg"]["attention_backend"] == "flash"
    assert cfg["policy"]["precision"] == "bfloat16"
    # interpolated from policy.precision / policy.model_name
    assert cfg["policy"]["megatron_cfg"]["pipeline_dtype"] == "bfloat16"
    assert isinstance(cfg["policy"]["tokenizer"]["name"], str)  # GRPO: ${policy.model_name}; SFT: the Instruct one
    assert "defaults" not in cfg


def test_mismatch_example_is_the_aligned_one_without_its_preset():
    aligned = load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
    mismatch = load_config(EXAMPLES / "grpo_math_1B_megatron_flash_mismatch.yaml")
    assert aligned["attention_align"]["preset"] == "aligned" and mismatch["attention_align"]["preset"] is None
    for cfg in (aligned, mismatch):
        cfg.pop("attention_align"), cfg["logger"].pop("log_dir")
    assert aligned == mismatch


def test_grpo_example_has_rollout_and_log_dir():
    cfg = load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "bfloat16"
    assert cfg["logger"]["log_dir"] == "logs/grpo_megatron_flash"
    # NeMo-RL's mul resolver
    seq = cfg["policy"]["max_total_sequence_length"]
    assert cfg["policy"]["sequence_packing"]["train_mb_tokens"] == seq * cfg["policy"]["train_micro_batch_size"]


def test_default_example_is_packaged():
    path = default_example_path()
    assert path.is_file() and path.name == "grpo_math_1B_megatron_flash.yaml"


def test_defaults_chain_string_list_and_relative_dirs(write_yaml):
    write_yaml("root/grand.yaml", "a: 1\nb: {x: 1, y: 1}\nc: ${a}\n")
    write_yaml("root/sub/parent.yaml", "defaults: ../grand.yaml\nb: {x: 2}\nonly_parent: p\n")
    write_yaml("root/sub/other.yaml", "b: {y: 3}\nlast: other\n")
    child = write_yaml("child.yaml", "defaults:\n  - root/sub/parent.yaml\n  - root/sub/other.yaml\na: 10\n")
    cfg = load_config(child)
    assert cfg == {"a": 10, "b": {"x": 2, "y": 3}, "c": 10, "only_parent": "p", "last": "other"}


def test_later_parent_wins_and_child_wins_last(write_yaml):
    write_yaml("p1.yaml", "k: one\n")
    write_yaml("p2.yaml", "k: two\n")
    assert load_config(write_yaml("c.yaml", "defaults: [p1.yaml, p2.yaml]\n"))["k"] == "two"
    assert load_config(write_yaml("c2.yaml", "defaults: [p1.yaml, p2.yaml]\nk: three\n"))["k"] == "three"


def test_absolute_defaults_path(write_yaml, tmp_path):
    parent = write_yaml("elsewhere/p.yaml", "k: abs\n")
    assert load_config(write_yaml("c.yaml", f"defaults: {parent}\n"))["k"] == "abs"


def test_override_marker_replaces_a_section(write_yaml):
    write_yaml("p.yaml", "sec: {a: 1, b: 2}\n")
    cfg = load_config(write_yaml("c.yaml", "defaults: p.yaml\nsec:\n  _override_: true\n  c: 3\n"))
    assert cfg["sec"] == {"c": 3}


def test_nemo_rl_resolvers(write_yaml):
    path = write_yaml(
        "r.yaml",
        "a: 6\nb: 4\nsum: ${add:${a},${b}}\nprod: ${mul:${a},${b}}\nq: ${div:${a},${b}}\nm: ${max:${a},${b}}\n",
    )
    cfg = load_config(path)
    assert (cfg["sum"], cfg["prod"], cfg["q"], cfg["m"]) == (10, 24, 1.5, 6)


def test_overrides_set_add_delete(write_yaml):
    path = write_yaml("o.yaml", "policy:\n  precision: bfloat16\n  dtype: ${policy.precision}\n  gone: 1\n")
    cfg = load_config(path, ["policy.precision=float32", "++policy.new.key=7", "~policy.gone", "+top=x"])
    assert cfg == {"policy": {"precision": "float32", "dtype": "float32", "new": {"key": 7}}, "top": "x"}


def test_mandatory_value_filled_by_child(write_yaml):
    write_yaml("p.yaml", "must: ???\n")
    assert load_config(write_yaml("c.yaml", "defaults: p.yaml\nmust: here\n"))["must"] == "here"


@pytest.mark.parametrize(
    "files, target, overrides, expected",
    [
        ({}, "missing.yaml", [], "does not exist"),
        ({"bad.yaml": "a: [1,\nb: 2\n"}, "bad.yaml", [], "YAML syntax error at line 3, column 1"),
        ({"tab.yaml": "a:\n\tb: 1\n"}, "tab.yaml", [], "YAML syntax error at line 2, column 1"),
        ({"c1.yaml": "defaults: c2.yaml\n", "c2.yaml": "defaults: c1.yaml\n"}, "c1.yaml", [], "defaults cycle"),
        ({"self.yaml": "defaults: self.yaml\n"}, "self.yaml", [], "defaults cycle"),
        ({"l.yaml": "- 1\n- 2\n"}, "l.yaml", [], "not a mapping"),
        ({"d.yaml": "defaults: {a: 1}\n"}, "d.yaml", [], "defaults="),
        ({"d.yaml": "defaults: nothere.yaml\n"}, "d.yaml", [], "does not exist"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["b=2"], "write ++b=VALUE"),
        ({"o.yaml": "a: {x: 1}\n"}, "o.yaml", ["a.y=2"], "write ++a.y=VALUE"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["a"], "malformed"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["a=[1,"], "malformed"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["=1"], "has no key"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["~b"], "nothing to delete"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["+a=2"], "already in the config"),
        ({"i.yaml": "a: ${nope}\n"}, "i.yaml", [], "interpolation at a cannot be resolved"),
        ({"i.yaml": "a:\n  b: ${mul:2,${x}}\nx: {y: 1}\n"}, "i.yaml", [], "interpolation at a.b"),
        ({"i.yaml": "a: ${unknown_resolver:1}\n"}, "i.yaml", [], "interpolation at a"),
        ({"o.yaml": "a: 1\n"}, "o.yaml", ["a=${nothere}"], "interpolation at a"),
    ],
)
def test_unusable_input_is_one_line_usage_error(write_yaml, tmp_path, files, target, overrides, expected):
    for name, text in files.items():
        write_yaml(name, text)
    with pytest.raises(UsageError) as info:
        load_config(tmp_path / target, overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert "Fix" in message


def test_directory_is_not_a_config(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        load_config(tmp_path)


def test_get_path():
    cfg = {"a": {"b": {"c": 1}}, "x": 5}
    assert get_path(cfg, "a.b.c") == 1
    assert get_path(cfg, "a.b.d", None) is None
    assert get_path(cfg, "x.y", "dflt") == "dflt"
    with pytest.raises(KeyError, match=re.escape("a.q")):
        get_path(cfg, "a.q")
