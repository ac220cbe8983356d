"""The architecture table's rules: evaluated against configs, and inferred from a host's answers.

The synthesizer (``scripts/architecture_synthesis.py``) runs in the lanes against the real hosts;
here it meets stand-in "hosts" written as plain functions, so each test says what a host does and
checks that the inferred rule reproduces it on configs it never saw.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

from nemo_rl_attn_align.model.architecture_rules import MISSING, evaluate, keys, layer_kind
from tests.conftest import REPO


def synthesis():
    path = REPO / "scripts" / "architecture_synthesis.py"
    spec = importlib.util.spec_from_file_location("architecture_synthesis", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = synthesis()


@pytest.mark.parametrize(
    ("rule", "config", "value"),
    [
        (["const", 7], {}, 7),
        (["key", "a.b"], {"a": {"b": 3}}, 3),
        (["key", "a.b"], {"a": 3}, MISSING),
        (["add", ["key", "w"], -1], {"w": 128}, 127),
        (["add", ["key", "w"], -1], {"w": None}, None),
        (["floordiv", ["key", "h"], ["key", "n"]], {"h": 96, "n": 4}, 24),
        (["floordiv", ["key", "h"], ["key", "n"]], {"h": 96, "n": 0}, None),
        (["sum", ["key", "a"], ["key", "b"]], {"a": 512, "b": 64}, 576),
        (["or", ["key", "d"], ["const", 8]], {"d": None}, 8),
        (["or", ["key", "d"], ["const", 8]], {}, 8),
        (["default", ["key", "d"], ["const", 8]], {"d": None}, None),
        (["default", ["key", "d"], ["const", 8]], {}, 8),
        (["pair", ["add", ["key", "w"], -1], ["const", 0]], {"w": 9}, [8, 0]),
        (["pair", ["add", ["key", "w"], -1], ["const", 0]], {"w": None}, None),
        (["map", ["key", "t"], {"x": 1, "y": 0}], {"t": ["x", "y"]}, [1, 0]),
        (["map", ["key", "t"], {"x": 1}], {"t": ["x", "z"]}, MISSING),
        (["join", ["map", ["key", "t"], {"m": "M", "a": "*"}]], {"t": ["m", "a"]}, "M*"),
        (["len", ["key", "p"]], {"p": "M*M-"}, 4),
        (["present", ["key", "w"]], {"w": 4}, True),
        (["present", ["key", "w"]], {"w": None}, False),
        (["present", ["key", "w"]], {}, MISSING),
        (["rsqrt", ["key", "d"]], {"d": 256}, 0.0625),
        (["rsqrt", ["key", "d"]], {"d": 0}, None),
        (["rsqrt", ["key", "d"]], {"d": None}, None),
        (["rsqrt", ["key", "d"]], {}, MISSING),
    ],
)
def test_rules_evaluate_as_documented(rule, config, value):
    assert evaluate(rule, config) == value if value is not MISSING else evaluate(rule, config) is MISSING


def test_an_unknown_operation_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'cube'"):
        evaluate(["cube", ["key", "a"]], {"a": 2})


def test_keys_names_what_a_rule_reads():
    rule = ["or", ["default", ["key", "head_dim"], ["const", 8]], ["floordiv", ["key", "h"], ["key", "n"]]]
    assert keys(rule) == ["head_dim", "h", "n"]


def test_layer_kinds_by_token_with_a_legacy_spelling_and_by_period():
    token = {"by": "token", "key": "layers_block_type", "else": "hybrid_override_pattern"}
    assert layer_kind(token, {"layers_block_type": ["mamba", "attention"]}, 1) == "attention"
    assert layer_kind(token, {"hybrid_override_pattern": "M*"}, 1) == "*"
    assert layer_kind(token, {}, 0) is None
    assert [layer_kind({"by": "period", "period": 2}, {}, i) for i in range(3)] == ["0", "1", "0"]


def _configs(n: int, seed: int = 3) -> list[dict]:
    """Sampled configs as the generator makes them: varied sizes, then some without head_dim or
    sliding_window and some with them null (each group with varied other sizes)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kv = rng.choice((1, 2, 4))
        heads = kv * rng.choice((2, 3))
        config = {"num_attention_heads": heads, "num_key_value_heads": kv, "hidden_size": heads * (16 + 8 * (i % 5))}
        config["head_dim"] = rng.choice((32, 40, 56))
        config["sliding_window"] = rng.choice((9, 17, 33))
        out.append(config)
    for i in (1, 2, 3):
        out[i].pop("head_dim")
        out[i + 3]["head_dim"] = None
        out[i]["sliding_window"] = None
        out[i + 3].pop("sliding_window")
    return out


def test_a_fallback_for_a_missing_key_is_learned_and_holds_on_unseen_configs():
    def host(config):  # as transformers fills head_dim: hidden // heads when absent or null
        return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]

    seen, unseen = _configs(12), _configs(12, seed=11)
    rule = S.synthesize(seen, [host(c) for c in seen])
    assert "head_dim" in keys(rule) and "hidden_size" in keys(rule)
    assert [evaluate(rule, c) for c in unseen] == [host(c) for c in unseen]


def test_a_window_pair_with_a_class_default_is_learned():
    def host(config):  # Megatron-Bridge: (sliding_window - 1, 0); the class default 4096 when absent; null: none
        window = config.get("sliding_window", 4096)
        return None if window is None else [window - 1, 0]

    seen, unseen = _configs(12), _configs(12, seed=5)
    rule = S.synthesize(seen, [host(c) for c in seen])
    assert rule[0] == "pair" and [evaluate(rule, c) for c in unseen] == [host(c) for c in unseen]


def test_no_rule_is_a_reason_not_a_guess():
    values = [random.Random(i).random() for i in range(8)]  # nothing in the configs explains them
    with pytest.raises(S.NoRule, match="no rule of the grammar"):
        S.synthesize(_configs(8), values)


def test_per_layer_kinds_by_a_period_and_by_a_per_layer_list():
    configs = [{"n": 4, "w": 9}, {"n": 6, "w": 17}, {"n": 5, "w": 33}]
    periodic = [[{"window": c["w"]} if i % 2 == 0 else {"window": None} for i in range(c["n"])] for c in configs]
    found = S.synthesize_layers(configs, periodic)
    assert found["partition"] == {"by": "period", "period": 2}
    assert found["kinds"]["0"] == {"window": ["key", "w"]}

    typed = [dict(c, types=["full", "linear", "full", "linear"][: c["n"]] + ["linear"] * (c["n"] - 4)) for c in configs]
    layers = [[{"heads": 8} if t == "full" else None for t in c["types"]] for c in typed]
    found = S.synthesize_layers(typed, layers)
    assert found["partition"] == {"by": "token", "key": "types"}
    assert found["kinds"] == {"full": {"heads": ["const", 8]}, "linear": None}


def test_a_softmax_scale_is_learned_as_one_over_the_root_of_the_dimension_it_is_taken_from():
    def host(config):  # Gemma: query_pre_attn_scalar ** -0.5 (not head_dim's), in the host's own arithmetic
        return config["query_pre_attn_scalar"] ** -0.5

    seen, unseen = _configs(12), _configs(12, seed=7)
    for i, config in enumerate(seen + unseen):
        config["query_pre_attn_scalar"] = (64, 144, 224, 256)[i % 4]
    rule = S.synthesize(seen, [host(c) for c in seen])
    assert rule == ["rsqrt", ["key", "query_pre_attn_scalar"]]
    assert all(S.same(evaluate(rule, c), host(c)) for c in unseen)
    with pytest.raises(S.NoRule):  # a scale of no integer dimension is not taken for one
        S.synthesize(seen[:4], [0.3, 0.31, 0.32, 0.33])
