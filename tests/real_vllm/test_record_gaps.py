"""What the rollout record used to get wrong, against real vLLM engines (issue 20, item 5).

* fp8 KV caches: vLLM allocates ``fp8`` (e4m3) and ``fp8_e5m2`` caches alike as ``torch.uint8``;
  the record names the format from each attention layer's ``kv_cache_dtype``. vLLM's CPU attention
  takes an FP8 cache only where torch sees AVX-512 or AMX (``fp8_kv_cache_runs_here``); on a CPU
  without either, the engines differ in page size instead, and an fp8 engine is asserted to stop at
  start with vLLM's own message, leaving no record.
* Several engines started one after another in one process (``serve_many.py``, in-process engine
  core) and in one user process that starts an engine-core process per engine (vLLM's default):
  one record per engine, the first never replaced.
* ``check``'s preview reports the tokenizer (by content, the files being local) and the KV-cache
  format as the record does; the RoPE sources name the attribute really read (transformers 5:
  ``rope_parameters``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.contract.contract_preview import predict_rollout
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.report.document import collect
from nemo_rl_attn_align.vocab.mandate import Mandate
from nemo_rl_attn_align.vocab.schema import Tier, fields_of
from tests.conftest import EXAMPLES
from tests.real_vllm.conftest import BASE_ARGS, HERE, IN_PROCESS, KV_CACHE_GIB, PROMPT

#: No semantic demand (every mandate field None).
NO_DEMAND = AlignSettings(mandate=Mandate(None, None, None, None, None))

pytestmark = pytest.mark.real_vllm

#: The engines of each run, in order: (name, engine args over BASE_ARGS); ``_NO_FP8``: where this
#: CPU takes no FP8 KV cache.
IN_PROCESS_ENGINES = (("auto", {}), ("fp8", {"kv_cache_dtype": "fp8"}), ("fp8_e5m2", {"kv_cache_dtype": "fp8_e5m2"}))
IN_PROCESS_ENGINES_NO_FP8 = (("auto", {}), ("block64", {"block_size": 64}), ("block128", {"block_size": 128}))
MULTIPROCESS_ENGINES = (("fp8_e5m2", {"kv_cache_dtype": "fp8_e5m2"}), ("block64", {"block_size": 64}))
MULTIPROCESS_ENGINES_NO_FP8 = (("block128", {"block_size": 128}), ("block64", {"block_size": 64}))
EXPECTED_KV = {"auto": "bf16", "fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "block64": "bf16", "block128": "bf16"}
#: vLLM's refusal of an FP8 KV cache on a CPU without AVX-512 and AMX (``cpu_attn.py``, 0.25 to 0.32).
FP8_REFUSED = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def fp8_kv_cache_runs_here() -> bool:
    """Whether vLLM's CPU attention takes an FP8 KV cache on this machine, by vLLM's own rule
    (``vllm/v1/attention/backends/cpu_attn.py`` ``_get_attn_isa``): only where torch sees AVX-512
    or AMX. The tests check the rule against the engine: where it says no, an fp8 engine must fail."""
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


@pytest.fixture(scope="module")
def fp8_runs() -> bool:
    return fp8_kv_cache_runs_here()


def serve_many(model: Path, report_dir: Path, engines, env: dict, expect_ok: bool = True) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_RL_ATTN_ALIGN", "VLLM_"))}
    full_env = {**base, "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report_dir), "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, **env}
    spec = {
        "engines": [{"model": str(model), "engine": {**BASE_ARGS, **args}} for _, args in engines],
        "prompt": PROMPT,
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "serve_many.py"), json.dumps(spec)],
        env=full_env,
        cwd=report_dir.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not expect_ok:
        return {"returncode": done.returncode, "stderr": done.stderr}
    assert done.returncode == 0, f"rc {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SERVE_RESULT ")]
    return {**json.loads(line.removeprefix("SERVE_RESULT ")), "stderr": done.stderr}


def _by_stem(folder: Path) -> dict[str, dict]:
    """File stem -> JSON, in worker-id order (``...-worker0`` before ``...-worker0-engine1``)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("rollout--*.json"), key=lambda p: p.stem)}


def records(report_dir: Path) -> dict[str, dict]:
    return _by_stem(report_dir / "workers")


def details(report_dir: Path) -> dict[str, dict]:
    return _by_stem(report_dir / "hosts")


IDS = ["rollout--vllm-rank0-worker0", "rollout--vllm-rank0-worker0-engine1", "rollout--vllm-rank0-worker0-engine2"]


def _folder(tmp_path_factory, name: str) -> Path:
    report_dir = tmp_path_factory.mktemp(name) / "report"
    report_dir.mkdir()
    return report_dir


@pytest.fixture(scope="module")
def in_process(models, tmp_path_factory, fp8_runs):
    """(report folder, what serve_many printed, the engines): three engines in one process."""
    engines = IN_PROCESS_ENGINES if fp8_runs else IN_PROCESS_ENGINES_NO_FP8
    report_dir = _folder(tmp_path_factory, "three-engines")
    return report_dir, serve_many(models["qwen3"], report_dir, engines, IN_PROCESS), engines


@pytest.fixture(scope="module")
def multiprocess(models, tmp_path_factory, fp8_runs):
    """(report folder, what serve_many printed, the engines): two engines, each in its engine-core process."""
    engines = MULTIPROCESS_ENGINES if fp8_runs else MULTIPROCESS_ENGINES_NO_FP8
    report_dir = _folder(tmp_path_factory, "two-engine-cores")
    return report_dir, serve_many(models["qwen3"], report_dir, engines, {}), engines


def test_kv_caches_are_named_by_their_format_not_the_tensor_dtype(in_process):
    report_dir, _, engines = in_process
    recorded, seen = records(report_dir), details(report_dir)
    assert list(recorded) == IDS
    for worker_id, (name, args) in zip(IDS, engines, strict=True):
        field = recorded[worker_id]["contract"]["fields"]["kv_cache_dtype"]
        assert (field["value"], field["provenance"]) == (EXPECTED_KV[name], "observed"), (worker_id, field)
        snapshot = seen[worker_id]["vllm_config"]
        assert set(snapshot["layer_kv_cache_dtypes"].values()) == {args.get("kv_cache_dtype", "auto")}
        # what the cache tensor says: the model dtype for auto, uint8 for both fp8 formats
        quantized = "kv_cache_dtype" in args
        assert snapshot["kv_cache_tensor_dtype"] == ("torch.uint8" if quantized else "torch.bfloat16")
        assert f"cache tensor {snapshot['kv_cache_tensor_dtype']}" in field["source"]


def test_an_fp8_kv_cache_runs_where_vllm_says_it_does(in_process, models, tmp_path_factory, fp8_runs):
    """Where vLLM's rule says this CPU takes an FP8 cache, the fp8 engines above recorded; where it
    says not, an fp8 engine stops at start with vLLM's own message and leaves no record behind."""
    if fp8_runs:  # the engines started and recorded their fp8 caches
        fields = [r["contract"]["fields"]["kv_cache_dtype"]["value"] for r in records(in_process[0]).values()]
        assert fields == ["bf16", "fp8_e4m3", "fp8_e5m2"]
        return
    report_dir = _folder(tmp_path_factory, "fp8-refused")
    refused = serve_many(models["qwen3"], report_dir, (("fp8", {"kv_cache_dtype": "fp8"}),), IN_PROCESS, False)
    assert refused["returncode"] != 0 and FP8_REFUSED in refused["stderr"], refused["stderr"][-3000:]
    assert records(report_dir) == {}


def test_engines_one_after_another_in_one_process_keep_one_record_each(in_process):
    report_dir, served, _ = in_process
    recorded, seen = records(report_dir), details(report_dir)
    assert [r["pid"] for r in recorded.values()] == [served["pid"]] * 3  # all in this one process
    assert [r["worker_id"] for r in recorded.values()] == [i.removeprefix("rollout--") for i in IDS]
    assert [d["peers"] for d in seen.values()] == [[i.removeprefix("rollout--")] for i in IDS]
    assert len(served["tokens"]) == 3 and all(len(t) == 4 for t in served["tokens"])
    assert "is replaced" not in served["stderr"] and "record is lost" not in served["stderr"]
    claims = [json.loads(p.read_text()) for p in sorted((report_dir / "claims").glob("*.json"))]
    assert len({c["writer"] for c in claims}) == 3 and len({c["session"] for c in claims}) == 1
    report = collect(report_dir, NO_DEMAND)  # the report lists all three
    assert [c["worker_id"] for c in report["contracts"]] == [i.removeprefix("rollout--") for i in IDS]
    assert report["workers"]["missing"] == []


def test_engine_core_processes_of_one_user_process_keep_one_record_each(multiprocess):
    report_dir, served, engines = multiprocess
    recorded = records(report_dir)
    assert list(recorded) == IDS[:2]
    pids = [r["pid"] for r in recorded.values()]
    assert len(set(pids)) == 2 and served["pid"] not in pids  # each in its own engine-core process
    fields = [r["contract"]["fields"] for r in recorded.values()]
    assert [f["kv_cache_dtype"]["value"] for f in fields] == [EXPECTED_KV[name] for name, _ in engines]
    # the first engine's record kept as it was
    assert [f["kv_page_size"]["value"] for f in fields] == [args.get("block_size", 32) for _, args in engines]


def test_the_preview_reports_the_tokenizer_and_kv_cache_format_as_the_record_does(in_process, models):
    report_dir, _, engines = in_process
    model = models["qwen3"]
    for worker_id, (name, args) in zip(IDS, engines, strict=True):
        overrides = [
            f"policy.model_name={model}",
            f"policy.tokenizer.name={model}",
            "policy.generation.vllm_cfg.precision=bfloat16",
            f"++policy.generation.vllm_cfg.kv_cache_dtype={args.get('kv_cache_dtype', 'auto')}",
        ]
        cfg = load_config(EXAMPLES / "grpo_math_1B_megatron_flash.yaml", overrides)
        predicted = predict_rollout(read_recipe_facts(cfg, {}), {})
        fields = records(report_dir)[worker_id]["contract"]["fields"]
        for field in ("tokenizer", "kv_cache_dtype", "dtype"):
            assert predicted[field].provenance.value == "configured", (name, field)
            assert predicted.value(field) == fields[field]["value"], (name, field)
        assert fields["tokenizer"]["value"].startswith("sha256:")
        known = ("observed", "configured")  # batch_size: not known to the vLLM worker
        both = [
            n
            for n in fields_of(Tier.IDENTITY)
            if predicted[n].provenance.value == "configured" and fields[n]["provenance"] in known
        ]
        assert {"tokenizer", "num_layers", "head_dim", "rope_type", "rope_parameters"} <= set(both)
        assert {n: predicted.value(n) for n in both} == {n: fields[n]["value"] for n in both}


def test_rope_sources_name_what_transformers_5_keeps(in_process):
    report_dir, _, _ = in_process
    fields = records(report_dir)[IDS[0]]["contract"]["fields"]
    assert fields["rope_type"]["source"] == "hf_config.rope_parameters['rope_type'] (absent: default)"
    assert fields["rope_parameters"]["source"] == "hf_config.rope_parameters"
    assert "rope_scaling" not in fields["rope_type"]["source"] + fields["rope_parameters"]["source"]
