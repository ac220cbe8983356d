"""The Megatron generation hook on a module laid out like NeMo-RL 7ea279a's.

``_GenerationModule`` is a stand-in, named as such: NeMo-RL does not install here (the lane
``tests/real_nemo_rl/test_megatron_generation.py`` drives the real mixin and megatron-core's real
inference context). Its mixin keeps the seam's name and signature and sets what the real one sets.
"""

from __future__ import annotations

import logging
import types

import pytest

from nemo_rl_attn_align.hosts import megatron_generation, megatron_worker
from nemo_rl_attn_align.hosts.seams import HOOKS
from nemo_rl_attn_align.report.store import read_worker_files
from nemo_rl_attn_align.vocab import patching as _patching
from tests.contract.test_megatron_generation_contract import CONTEXT

MODULE = HOOKS["megatron_generation"].seams[0].module

MODEL_CONFIG = types.SimpleNamespace(
    params_dtype="torch.bfloat16",
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=16,
    tensor_model_parallel_size=1,
    batch_invariant_mode=False,
    deterministic_mode=False,
    flash_attention_version=2,
)


def _generation_module(**seam_kwargs):
    """A stand-in of ``nemo_rl.models.generation.megatron.megatron_worker``."""

    class MegatronGenerationMixin:
        calls = 0

        def _gen_model(self):
            return types.SimpleNamespace(module=types.SimpleNamespace(config=MODEL_CONFIG))

        def _initialize_inference_engine(self, mcore_generation_config):
            MegatronGenerationMixin.calls += 1
            if self._inference_engine_initialized:
                return
            self.inference_context = types.SimpleNamespace(**CONTEXT.attributes())
            self._inference_engine_initialized = True

    module = types.ModuleType(MODULE)
    module.MegatronGenerationMixin = MegatronGenerationMixin
    return module


class Worker:
    rank, cfg, _inference_engine_initialized = 3, {}, False


@pytest.fixture
def report_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_REPORT_DIR", str(tmp_path))
    monkeypatch.delenv("NEMO_RL_ATTN_ALIGN_STRICT", raising=False)
    yield tmp_path
    megatron_generation.detach()


def test_the_engine_records_once_per_worker(report_dir):
    module = _generation_module()
    megatron_generation._seams.patch(module)
    worker = type("W", (module.MegatronGenerationMixin, Worker), {})()
    worker._initialize_inference_engine({})
    worker._initialize_inference_engine({})
    [record] = read_worker_files(report_dir).records
    contract, probe = record.contract, record.probe
    assert (contract.side, contract.worker_id) == ("rollout", "megatron-gen-rank3")
    assert contract.value("kv_page_size") == 256 and contract.value("backend") == "flash_attn_2"
    assert probe is not None and module.MegatronGenerationMixin.calls == 2
    assert _patching.unwrap(module.MegatronGenerationMixin, "_initialize_inference_engine")


def test_a_missing_seam_is_one_warning_and_strict_stops(report_dir, caplog, monkeypatch):
    module = types.ModuleType(MODULE)
    with caplog.at_level(logging.WARNING, "nemo_rl_attn_align"):
        megatron_generation._seams.patch(module)
    assert "MegatronGenerationMixin._initialize_inference_engine" in caplog.text
    monkeypatch.setenv("NEMO_RL_ATTN_ALIGN_STRICT", "1")
    with pytest.raises(_patching.HostLayoutError):
        megatron_generation._seams.patch(types.ModuleType(MODULE))


def test_a_failure_while_recording_never_stops_generation(report_dir, caplog, monkeypatch):
    module = _generation_module()
    megatron_generation._seams.patch(module)
    monkeypatch.setattr(megatron_generation, "record_engine", lambda worker: 1 / 0)
    worker = type("W", (module.MegatronGenerationMixin, Worker), {})()
    with caplog.at_level(logging.WARNING, "nemo_rl_attn_align"):
        worker._initialize_inference_engine({})
    assert worker._inference_engine_initialized
    assert "recording the Megatron generation engine" in caplog.text


def test_a_dedicated_inference_worker_writes_no_training_record(report_dir, monkeypatch):
    record = megatron_worker.TrainingRecord()
    record.policy_cfg = {
        "generation": {"backend": "megatron"},
        "megatron_cfg": {"buffer_size_gb": 1, "block_size_tokens": 256, "kv_cache_management_mode": "persist"},
    }
    assert record.generation_only and record.write("model_config") is None
    assert read_worker_files(report_dir).records == ()
