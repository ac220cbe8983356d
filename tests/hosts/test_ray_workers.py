"""The plugin in Ray actors started the way NeMo-RL starts them, on a real local Ray cluster.

NeMo-RL (``virtual_cluster.init_ray``, ``RayWorkerGroup._create_workers_from_bundle_indices``)
copies the driver's whole ``os.environ`` into each actor's ``runtime_env["env_vars"]`` and gives
each worker its own ``py_executable`` (a uv venv that has ray, torch, vllm ... but not packages
pip-installed into the driver's environment) and its own RANK. Here:

* ``rank 0`` runs the driver's own interpreter (``py_executable == sys.executable``);
* ``rank 1`` and ``rank 2`` run a venv made without system site-packages whose only extra path is a
  directory of links to the driver's site-packages entries *minus* this plugin and every ``.pth``
  file: like NeMo-RL's venvs it has ray and the stand-in vLLM, not the plugin. It reaches the plugin
  only through the ``PYTHONPATH`` shim the driver hook exported when it attached (the recipe's
  import of ``nemo_rl.algorithms.grpo``, before ``init_ray()``); the driver's ``.pth`` exports
  nothing. A stdlib venv plus links starts in milliseconds, where a real ``uv venv`` with ray would
  take minutes and the network.

Each actor imports the stand-in ``vllm.v1.worker.gpu_worker`` (``tests/fake_vllm``) and warms up an
engine; the hook writes one record per worker into the shared report dir. ``rank 2`` is killed first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from nemo_rl_attn_align.hosts import bootstrap, nemo_rl_driver  # noqa: E402
from nemo_rl_attn_align.report.store import read_worker_files  # noqa: E402
from tests.hosts.conftest import FAKE_NEMO_RL, FAKE_VLLM, standin, venv_without_plugin  # noqa: E402

pytestmark = pytest.mark.slow


def driver_environment(bootstrap_state) -> dict[str, str]:
    """``os.environ`` of a NeMo-RL driver once the recipe has imported its algorithm module, which
    is what ``init_ray()`` and ``RayWorkerGroup`` copy into every actor (``dict(os.environ)``)."""
    bootstrap_state.deactivate()
    bootstrap_state.activate("pth")  # what the .pth of the driver's environment does at start
    before = os.environ.get("PYTHONPATH")
    assert bootstrap.SHIM_DIR not in (before or "").split(os.pathsep)  # activating exported nothing
    with standin(FAKE_NEMO_RL / "v0_6", "nemo_rl"):
        from nemo_rl.algorithms.grpo import setup  # noqa: F401 - examples/run_grpo.py, at its top

        env = dict(os.environ)
    nemo_rl_driver.detach()
    assert os.environ.get("PYTHONPATH") == before  # detach takes the export back
    # A PYTHONPATH pointing at a checkout of the plugin would put it in the worker venv too.
    entries = env.get("PYTHONPATH", "").split(os.pathsep)
    assert entries[0] == bootstrap.SHIM_DIR
    kept = [entries[0], *(p for p in entries[1:] if not os.path.isdir(os.path.join(p, "nemo_rl_attn_align")))]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def make_probe_actor():
    """An actor class built here, so Ray ships it by value (the worker need not import this file)."""

    class EngineProbe:
        def where(self):
            import sys
            from importlib.machinery import PathFinder

            # found on sys.path itself (not only through the shim's finder)?
            on_path = PathFinder.find_spec("nemo_rl_attn_align", sys.path) is not None
            return {"prefix": sys.prefix, "python": sys.executable, "plugin_on_sys_path": on_path}

        def warm_up_engine(self):
            import os
            import sys

            import vllm.v1.worker.gpu_worker as gpu_worker  # the stand-in; the plugin hooks it on import

            from nemo_rl_attn_align.hosts import bootstrap
            from nemo_rl_attn_align.vocab import patching as _patching

            worker = gpu_worker.Worker(rank=0)
            worker.compile_or_warm_up_model()
            return {
                "origin": bootstrap.origin,
                "prefix": sys.prefix,
                "plugin_from": sys.modules["nemo_rl_attn_align"].__file__,
                "wrapped": _patching.is_wrapped(gpu_worker.Worker.compile_or_warm_up_model),
                "rank": os.environ["RANK"],
            }

    return ray.remote(num_cpus=0)(EngineProbe)


def test_plugin_active_in_every_actor_and_records_arrive(ray_cluster, tmp_path, bootstrap_state):
    other_python = venv_without_plugin(tmp_path)
    control = subprocess.run(
        [str(other_python), "-c", "import ray, nemo_rl_attn_align"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
    )
    assert "No module named 'nemo_rl_attn_align'" in control.stderr  # ray imports there; the plugin does not

    report_dir = tmp_path / "report"
    driver_env = driver_environment(bootstrap_state)
    driver_env["PYTHONPATH"] = os.pathsep.join([driver_env["PYTHONPATH"], str(FAKE_VLLM)])
    driver_env["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] = str(report_dir)
    driver_env["STANDIN_LAYER_BACKENDS"] = "FLASH_ATTN,FLASHINFER"
    driver_env["WORLD_SIZE"] = "3"

    Probe = make_probe_actor()
    actors = []
    for rank, python in ((0, sys.executable), (1, str(other_python)), (2, str(other_python))):
        env_vars = {**driver_env, "RANK": str(rank), "VIRTUAL_ENV": str(Path(python).parent.parent)}
        actors.append(Probe.options(runtime_env={"env_vars": env_vars, "py_executable": python}).remote())

    where = ray.get([a.where.remote() for a in actors])
    assert where[1]["prefix"] == where[2]["prefix"] == str(tmp_path / "venv") != where[0]["prefix"]
    assert not where[1]["plugin_on_sys_path"] and not where[2]["plugin_on_sys_path"]
    ray.kill(actors[2])  # a worker that dies before its engine is up
    seen = ray.get([a.warm_up_engine.remote() for a in actors[:2]])

    assert seen[0]["origin"] in ("pth", "shim") and seen[0]["wrapped"]
    assert seen[1]["origin"] == "shim" and seen[1]["wrapped"]  # only the shim could have brought it
    assert seen[1]["prefix"] == str(tmp_path / "venv")

    files = read_worker_files(report_dir)
    assert files.unreadable == () and files.incomplete_writes == ()
    ids = [record.worker_id for record in files.records]
    assert ids == ["vllm-rank0-worker0", "vllm-rank1-worker0"]  # rank 2 is a visible gap
    for contract, probe in ((record.contract, record.probe) for record in files.records):
        assert contract.side == "rollout"
        assert contract.value("backend") == {
            "model.layers.0.self_attn.attn": "FLASH_ATTN",
            "model.layers.1.self_attn.attn": "FLASHINFER",
        }
        assert contract.value("kv_page_size") == 16 and contract.value("chunked_prefill_chunk") == 2048
        assert probe is not None
    details = files.details
    assert sorted(details) == [("rollout", "vllm-rank0-worker0"), ("rollout", "vllm-rank1-worker0")]
    assert {d.rest["world_size"] for d in details.values()} == {3}
    assert {d.peers for d in details.values()} == {("vllm-rank0-worker0", "vllm-rank1-worker0", "vllm-rank2-worker0")}
