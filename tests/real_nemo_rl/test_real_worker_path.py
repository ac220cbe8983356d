"""The plugin's hooks on the real NeMo-RL modules: the Megatron worker path and the driver's ``setup()``.

Each ref is probed once, in its own process (``host_probe.py``; every ref's package is ``nemo_rl``;
the four run side by side),
with the tree and the stand-ins on ``PYTHONPATH`` and the plugin's ``.pth`` active. The tests here
judge what it recorded:

* the worker path (7ea279a, v0.7.0, v0.6.0): the worker module's ``validate_and_set_config`` ->
  ``setup_model_config`` -> ``_apply_performance_config`` on a tiny checkpoint with the ref's own
  GRPO recipe. Flash + FP32 stops with ``FLASH_REQUIRES_HALF_PRECISION`` as a ``ValueError`` before
  the body of upstream's ``_apply_performance_config`` runs; flash + BF16 sets
  ``AttnBackend.flash`` exactly once, in upstream's ``_apply_performance_config``, and the training
  record holds every contract field with the model's values;
* the 0.5.x layout (v0.5.0): its worker module does not import on these machines, for the precise
  reason asserted (a megatron-core module 0.19.2 no longer has; behind it vLLM, imported at module
  level, which the lane has not); its seam is read from the source;
* the GPU suite (all refs): where ``nemo_rl`` imports, ``pytest -m mcore`` drives the real worker
  path (``tests/gpu/nemo_rl_host.py``), and that path's CPU part takes every policy the suite sends;
* the driver (all refs): every ``nemo_rl.algorithms`` module's ``setup`` and train functions are
  wrapped with the signatures the hook expects, the names ``examples/run_grpo.py`` / ``run_sft.py``
  import are the wrapped ones, and a flash + FP32 ``MasterConfig`` stops in the pre-flight before
  the original ``setup`` body runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from nemo_rl_attn_align.contract.contract import AttentionContract
from nemo_rl_attn_align.contract.contract_preview import predict_training
from nemo_rl_attn_align.hosts.seams import HOOKS, OPTIONAL
from nemo_rl_attn_align.preflight.recipe_facts import read_recipe_facts
from nemo_rl_attn_align.vocab.schema import FIELD_NAMES, Tier, fields_of
from tests.gpu.cases import model_runner_policies

from .conftest import REFS, SEAM_TEST_REFS, VALIDATION_REFS, snapshot
from .host_probe import TINY

pytestmark = pytest.mark.real_nemo_rl

REPO = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).parent / "stand_ins"
_running: dict[str, tuple[subprocess.Popen, Path]] = {}
_probes: dict[str, dict] = {}


def _start(ref: str, tree: Path, directory: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tree), str(STAND_INS)]),
        "NEMO_RL_ATTN_ALIGN": "1",
    }
    for name in ("NEMO_RL_ATTN_ALIGN_SETTINGS", "NEMO_RL_ATTN_ALIGN_REPORT_DIR", "NEMO_RL_ATTN_ALIGN_STRICT"):
        env.pop(name, None)
    with open(directory / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.real_nemo_rl.host_probe", str(tree), str(directory / "probe.json")],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    _running[ref] = (proc, directory)


@pytest.fixture(scope="module", autouse=True)
def _no_probe_left_running():
    yield
    for proc, _ in _running.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def probe(ref: str, tmp_path_factory) -> dict:
    """``host_probe``'s facts for ``ref``. The first call starts one process per available ref, side
    by side (most of each is importing); each ref's facts are read once."""
    tree = snapshot(ref)
    if ref not in _running:
        for other in REFS:
            other_tree = tree.parent / other
            if other not in _running and (other == ref or (other_tree / "nemo_rl").is_dir()):
                _start(other, other_tree, tmp_path_factory.mktemp(f"probe-{other}"))
    if ref not in _probes:
        proc, directory = _running[ref]
        returncode = proc.wait(timeout=900)
        out = directory / "probe.json"
        assert returncode == 0 and out.is_file(), (
            f"probe of {ref} exited {returncode}:\n{(directory / 'stderr.txt').read_text()[-4000:]}"
        )
        _probes[ref] = json.loads(out.read_text())
    return _probes[ref]


def _in_order(frames: list, wanted: list[tuple[str, str]]) -> bool:
    it = iter(tuple(f) for f in frames)
    return all(step in it for step in wanted)


@pytest.mark.parametrize("ref", SEAM_TEST_REFS)
def test_flash_fp32_stops_in_the_worker_before_upstream_code(ref, tmp_path_factory):
    worker = probe(ref, tmp_path_factory)["worker"]
    assert worker["imported"] and worker["layout"] == "setup-module", worker
    assert len(worker["wrapped"]) == 3, worker["wrapped"]
    run = worker["fp32"]
    error = run["error"]
    assert error is not None, "flash + float32 was not stopped"
    assert (error["type"], error["is_value_error"], error["codes"]) == (
        "RuleViolation",
        True,
        ["FLASH_REQUIRES_HALF_PRECISION"],
    )
    assert error["message"].startswith(
        "nemo-rl-attn-align: error FLASH_REQUIRES_HALF_PRECISION: policy.precision='float32'"
    )
    assert "\n" not in error["message"] and "Fix: set policy.precision=bfloat16" in error["message"]
    plugin, setup = "nemo_rl_attn_align.hosts.megatron_worker", "nemo_rl.models.megatron.setup"
    chain = [
        (plugin, "validate_and_set_config"),
        (setup, "validate_and_set_config"),
        (setup, "setup_model_config"),
        (plugin, "_apply_performance_config"),
        (plugin, "check_policy"),
    ]
    assert _in_order(error["frames"], chain), error["frames"]
    after = error["frames"][[tuple(f) for f in error["frames"]].index((plugin, "_apply_performance_config")) :]
    assert not any(module.startswith("nemo_rl.") for module, _ in after), after  # raised before upstream's body
    assert run["entered"] == ["setup_model_config"]  # upstream's _apply_performance_config never entered
    assert [a for a in run["assignments"] if a["value"] != "auto"] == [] and run["attention_backend"] is None
    assert run["records"] == {"written": False}


@pytest.mark.parametrize("ref", SEAM_TEST_REFS)
def test_bf16_flash_is_mapped_once_by_upstream_and_recorded(ref, tmp_path_factory):
    facts = probe(ref, tmp_path_factory)
    run = facts["worker"]["bf16"]
    assert run["error"] is None, run["error"]
    assert run["entered"] == ["setup_model_config", "_apply_performance_config"]
    flash = [a for a in run["assignments"] if a["value"] != "auto"]  # "auto": the dataclass default at __init__
    assert flash == [
        {"value": "flash", "function": "_apply_performance_config", "file": "nemo_rl/models/megatron/setup.py"}
    ]
    assert run["attention_backend"] == "flash" and run["backend_mapped_by"] == "nemo_rl"
    assert facts["plugin_warnings"] == []

    records = run["records"]
    assert records["written"] and records["unreadable"] == [] and len(records["contracts"]) == 1, records
    contract = AttentionContract.from_dict(records["contracts"][0])
    assert (contract.side, contract.worker_id, tuple(contract.fields)) == ("training", "policy-rank0", FIELD_NAMES)
    expected = {
        "num_layers": TINY["num_layers"],
        "num_attention_heads": TINY["num_attention_heads"],
        "num_query_groups": TINY["num_query_groups"],
        "head_dim": TINY["kv_channels"],
        "softmax_scale": TINY["kv_channels"] ** -0.5,
        "vocab_size": TINY["vocab_size"],
        "causal": True,
        "sliding_window": None,
        "rope_type": "default",
        "dtype": "bf16",
        "cp_size": 1,
        "tp_size": 1,
    }
    assert {name: contract.value(name) for name in expected} == expected
    assert all(contract[name].provenance.known for name in expected)
    assert contract.value("rope_parameters")["theta"] == TINY["rotary_base"]
    assert (contract["backend"].provenance.value, contract.value("backend")) == (
        "unobservable",
        "flash",
    )  # not read back yet
    assert contract.value("versions")["megatron-core"] == metadata.version("megatron-core")
    predicted = predict_training(
        read_recipe_facts({"policy": run["policy"]})
    )  # what `check` previews for the same policy
    assert {n: contract.value(n) for n in fields_of(Tier.SEMANTIC)} == {
        n: predicted.value(n) for n in fields_of(Tier.SEMANTIC)
    }
    [detail] = records["details"]
    assert (detail["stage"], detail["layout"], detail["backend_mapped_by"]) == (
        "model_config",
        "setup-module",
        "nemo_rl",
    )
    assert detail["findings"] == []
    assert detail["plan"]["effective"] == "flash" and detail["model_config"]["params_dtype"] == "torch.bfloat16"


def test_v0_5_worker_layout_as_far_as_it_imports(tmp_path_factory):
    """v0.5.0's worker module stops at its line 70 on megatron-core 0.19.2, and behind that it needs
    vLLM at module level (``nemo_rl/models/generation/fp8.py``), which the lane has not; if either
    changes, this fails and the worker-inline path (``setup_megatron_model``) should be driven here."""
    worker = probe("v0.5.0", tmp_path_factory)["worker"]
    assert not worker["imported"], (
        "v0.5.0's worker module imports now: drive its worker-inline path like the >= 0.6 refs"
    )
    assert (worker["type"], worker["name"], worker["file"], worker["line"]) == (
        "ModuleNotFoundError",
        "megatron.core.inference.model_inference_wrappers.inference_wrapper_config",
        "nemo_rl/models/policy/workers/megatron_policy_worker.py",
        70,
    ), worker
    seam = worker["seam"]
    [inline] = [seam for seam in HOOKS["megatron_worker"].seams if seam.group == "worker-inline"]
    assert tuple(seam["params"][: len(inline.params)]) == inline.params  # the hook's signature check would pass
    assert seam["called_by_name_in"] == [
        "MegatronPolicyWorker.__init__"
    ]  # a module global: wrapping it reaches the call
    assert seam["fp8_module_level_vllm_imports"] and seam["vllm_importable"] is False


@pytest.mark.parametrize("ref", REFS)
def test_driver_hook_wraps_every_algorithm(ref, tmp_path_factory):
    facts = probe(ref, tmp_path_factory)
    modules = facts["driver"]["modules"]
    assert facts["plugin_warnings"] == []  # every hook attached, every version inside its range
    with_setup = {name for name, module in modules.items() if "setup_params" in module}
    driver_seams = HOOKS["nemo_rl_driver"].seams
    setups = {seam.module for seam in driver_seams if seam.path == "setup"}
    assert with_setup and with_setup <= setups, with_setup - setups
    for name, module in modules.items():
        # every train function of this ref is one the hook wraps (its list also names those other refs have)
        assert set(module["train_functions"]) <= {
            seam.path for seam in driver_seams if seam.module == name and seam.group == OPTIONAL
        }, (name, module)
        if name in with_setup:
            assert module["setup_params"][0] == "master_config" and module["signature_kept"], (name, module)
        expected = [*module["train_functions"], *(["setup"] if name in with_setup else [])]
        assert module["wrapped"] == sorted(expected), (name, module)


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
@pytest.mark.parametrize("ref", REFS)
def test_flash_fp32_recipe_stops_in_the_driver_preflight(ref, algorithm, tmp_path_factory):
    run = probe(ref, tmp_path_factory)["driver"]["flash_fp32"][algorithm]
    assert run["imported_wrapped"] and all(run["imported_wrapped"].values()), run["imported_wrapped"]
    assert run["master_config_type"] == ("MasterConfig" if ref in VALIDATION_REFS else "dict")
    error = run["error"]
    assert (error["type"], error["is_value_error"], error["codes"]) == (
        "RuleViolation",
        True,
        ["FLASH_REQUIRES_HALF_PRECISION"],
    )
    assert _in_order(
        error["frames"],
        [("nemo_rl_attn_align.hosts.nemo_rl_driver", "setup"), ("nemo_rl_attn_align.hosts.nemo_rl_driver", "prepare")],
    ), error["frames"]
    assert not any(module.startswith("nemo_rl.") for module, _ in error["frames"]), error["frames"]
    assert run["original_setup_entered"] == [] and run["settings_exported"] is False


@pytest.mark.parametrize("ref", REFS)
def test_gpu_suite_drives_the_real_worker_path_where_nemo_rl_imports(ref, tmp_path_factory):
    gpu = probe(ref, tmp_path_factory)["gpu_suite"]
    tree = snapshot(ref)
    assert gpu["host"]["kind"] == "real" and Path(gpu["host"]["location"]).resolve() == (tree / "nemo_rl").resolve(), (
        gpu["host"]
    )
    assert gpu["line"].startswith("mcore suite: real NeMo-RL worker path (nemo_rl "), gpu["line"]
    if ref not in SEAM_TEST_REFS:  # 0.5.x: the worker module does not import here (test above), so no case runs
        assert gpu["cases"] == []
        return
    assert len(gpu["cases"]) == len(model_runner_policies())
    for run in gpu["cases"]:
        case, megatron = run["case"], run["case"]["megatron_cfg"]
        if case["precision"] == "float32":
            assert run["error"]["codes"] == ["FLASH_REQUIRES_HALF_PRECISION"] and run["model"] is None, run
            continue
        assert run["error"] is None, run["error"]
        model = run["model"]
        assert {key: model[key] for key in case["standin_model"]} == case["standin_model"], (case, model)
        assert (model["attention_backend"], model["params_dtype"]) == (megatron["attention_backend"], "torch.bfloat16")
        assert model["layer_spec"] == (
            "local_layer_spec" if megatron["transformer_impl"] == "local" else "default_layer_spec"
        )
