"""The plugin in Ray actors started the way NeMo-RL starts them, on a real local Ray cluster.

NeMo-RL (``virtual_cluster.init_ray``, ``RayWorkerGroup._create_workers_from_bundle_indices``)
copies the driver's whole ``os.environ`` into each actor's ``runtime_env["env_vars"]`` and gives
each worker its own ``py_executable`` (a uv venv that has ray, torch, vllm ... but not packages
pip-installed into the driver's environment) and its own RANK. Here:

* ``rank 0`` runs the driver's own interpreter (``py_executable == sys.executable``);
* ``rank 1`` and ``rank 2`` run a venv made without system site-packages whose only extra path is a
  directory of links to the driver's site-packages entries *minus* this plugin and every ``.pth``
  file: like NeMo-RL's venvs it has ray and the stand-in vLLM, not the plugin. It reaches the plugin
  only through the ``PYTHONPATH`` shim the driver exported (``bootstrap.export_shim``, which the
  driver's ``.pth`` does at start). A stdlib venv plus links starts in milliseconds, where a real
  ``uv venv`` with ray would take minutes and the network.

Each actor imports the stand-in ``vllm.v1.worker.gpu_worker`` (``tests/fake_vllm``) and warms up an
engine; the hook writes one record per worker into the shared report dir. ``rank 2`` is killed first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from nemo_rl_attn_align.hosts import bootstrap  # noqa: E402
from nemo_rl_attn_align.report import read_worker_records  # noqa: E402
from tests.hosts.conftest import FAKE_VLLM, make_bare_venv  # noqa: E402

pytestmark = pytest.mark.slow


def venv_without_plugin(root: Path) -> Path:
    """A venv seeing the driver's site-packages except this plugin and all ``.pth`` files."""
    python = make_bare_venv(root / "venv")
    links = root / "site-without-plugin"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.startswith(("nemo_rl_attn_align", "__editable__", "nemo-rl-attn-align")) or name.endswith(".pth"):
            continue
        (links / name).symlink_to(entry)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "driver_site_without_plugin.pth").write_text(f"{links}\n")
    return python


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

            worker = gpu_worker.Worker(rank=0)
            worker.compile_or_warm_up_model()
            return {
                "origin": bootstrap.origin,
                "prefix": sys.prefix,
                "plugin_from": sys.modules["nemo_rl_attn_align"].__file__,
                "wrapped": hasattr(gpu_worker.Worker.compile_or_warm_up_model, "__nemo_rl_attn_align_original__"),
                "rank": os.environ["RANK"],
            }

    return ray.remote(num_cpus=0)(EngineProbe)


def test_plugin_active_in_every_actor_and_records_arrive(ray_cluster, tmp_path):
    other_python = venv_without_plugin(tmp_path)
    control = subprocess.run([str(other_python), "-c", "import ray, nemo_rl_attn_align"], capture_output=True, text=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert "No module named 'nemo_rl_attn_align'" in control.stderr  # ray imports there; the plugin does not

    report_dir = tmp_path / "report"
    driver_env = dict(os.environ)  # NeMo-RL: env_vars = dict(os.environ)
    bootstrap.export_shim(driver_env)
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

    records = read_worker_records(report_dir)
    assert records["unreadable"] == [] and records["incomplete_writes"] == []
    ids = [contract.worker_id for contract, _ in records["records"]]
    assert ids == ["vllm-rank0-worker0", "vllm-rank1-worker0"]  # rank 2 is a visible gap
    for contract, probe in records["records"]:
        assert contract.side == "rollout"
        assert contract.value("backend") == {"model.layers.0.self_attn.attn": "FLASH_ATTN", "model.layers.1.self_attn.attn": "FLASHINFER"}
        assert contract.value("kv_page_size") == 16 and contract.value("chunked_prefill_chunk") == 2048
        assert probe is not None
    details = records["details"]
    assert sorted(details) == [("rollout", "vllm-rank0-worker0"), ("rollout", "vllm-rank1-worker0")]
    assert {d["world_size"] for d in details.values()} == {3}
    assert {tuple(d["peers"]) for d in details.values()} == {("vllm-rank0-worker0", "vllm-rank1-worker0", "vllm-rank2-worker0")}
