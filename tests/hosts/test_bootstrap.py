"""Interpreter-start activation in fresh subprocesses against a real install of the plugin.

``plugin_venv`` is a stdlib-only venv with the plugin installed from its wheel, so its
``nemo_rl_attn_align.pth`` runs at every start; a second bare venv stands for an environment that
lacks the plugin (NeMo-RL's per-worker uv venvs) and reaches it only through the ``PYTHONPATH`` shim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from nemo_rl_attn_align.hosts import bootstrap
from tests.hosts.conftest import FAKE_NEMO_RL, FAKE_VLLM, make_bare_venv, site_packages

PROBE = textwrap.dedent(
    """
    import json, os, sys
    before = set(sys.modules)
    from nemo_rl_attn_align.hosts import bootstrap
    finders = [type(f).__name__ for f in sys.meta_path]
    print(json.dumps({
        "origin": bootstrap.origin,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "finders": finders,
        "modules": sorted(m for m in before if m.startswith("nemo_rl_attn_align")),
        "heavy": sorted(m for m in ("torch", "ray", "megatron", "vllm", "pydantic", "omegaconf") if m in sys.modules),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "user_site_ran": os.environ.get("USER_SITECUSTOMIZE_RAN") == "1" or getattr(sys.modules.get("sitecustomize"), "RAN", False),
    }))
    """  # noqa: E501 (the probe program, kept verbatim)
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("NEMO_RL_ATTN_ALIGN")}
    env.update(extra)
    return env


def run_python(python, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in ``python`` from a directory that holds no source tree (``-c`` puts the cwd on sys.path)."""
    return subprocess.run(
        [str(python), "-c", code],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(python),
    )


def probe(python, **env: str) -> dict:
    out = run_python(python, PROBE, **env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def shim_dir(python) -> str:
    return str(site_packages(python) / "nemo_rl_attn_align" / "_shim")


def test_pth_activates_every_interpreter_lazily(plugin_venv):
    seen = probe(plugin_venv)
    assert seen["origin"] == "pth"
    assert seen["pythonpath"] == ""  # activation exports nothing: children of pip or pytest stay as they were
    assert seen["finders"].count("_PostImportFinder") == 1
    # only the bootstrap and the seams it watches ran: no host module, no host library
    assert seen["modules"] == [
        "nemo_rl_attn_align",
        "nemo_rl_attn_align.hosts",
        "nemo_rl_attn_align.hosts.bootstrap",
        "nemo_rl_attn_align.hosts.seams",
    ]
    assert seen["heavy"] == []


def test_the_environment_of_the_plugin_env_gains_nothing(plugin_venv, tmp_path):
    show = "import os; print(os.environ.get('PYTHONPATH'))"
    assert run_python(plugin_venv, show).stdout == "None\n"
    assert run_python(plugin_venv, show, PYTHONPATH=str(tmp_path)).stdout == f"{tmp_path}\n"


DRIVER = textwrap.dedent(
    """
    import os, subprocess, sys
    sys.path.insert(0, {tree!r})
    print(os.environ.get("PYTHONPATH"))
    from nemo_rl.utils.logger import get_next_experiment_dir  # as examples/run_grpo.py does at its top
    print(os.environ.get("PYTHONPATH"))  # what init_ray() then copies into the job's runtime_env
    from nemo_rl_attn_align.hosts import nemo_rl_driver
    nemo_rl_driver.detach()
    print(os.environ.get("PYTHONPATH"))
    """
)


def test_the_driver_hook_exports_the_shim_when_it_attaches(plugin_venv):
    """A NeMo-RL driver in the plugin's environment: the shim is on PYTHONPATH once the recipe has
    imported a NeMo-RL driver module (before ``init_ray()``), and off again after ``detach()``."""
    out = run_python(plugin_venv, DRIVER.format(tree=str(FAKE_NEMO_RL / "v0_6")))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["None", shim_dir(plugin_venv), "None"]
    off = run_python(plugin_venv, DRIVER.format(tree=str(FAKE_NEMO_RL / "v0_6")), NEMO_RL_ATTN_ALIGN="0")
    assert off.returncode == 0 and off.stdout.splitlines() == ["None", "None", "None"]


def test_switch_off_turns_everything_off(plugin_venv):
    seen = probe(plugin_venv, NEMO_RL_ATTN_ALIGN="0")
    assert seen["origin"] is None
    assert seen["pythonpath"] == ""
    assert "_PostImportFinder" not in seen["finders"]
    code = (
        f"import sys; sys.path.insert(0, {str(FAKE_VLLM)!r}); import vllm.v1.worker.gpu_worker as w; "
        "from nemo_rl_attn_align.vocab.patching import is_wrapped; "
        "print(is_wrapped(w.Worker.compile_or_warm_up_model))"
    )
    out = run_python(plugin_venv, code, NEMO_RL_ATTN_ALIGN="off")
    assert out.stdout.strip() == "False" and "nemo-rl-attn-align" not in out.stderr


def test_hook_fires_on_import_and_attaching_twice_is_harmless(plugin_venv):
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(FAKE_VLLM)!r})
        from nemo_rl_attn_align.hosts import bootstrap
        print("host imported before:", "nemo_rl_attn_align.hosts.vllm_worker" in sys.modules)
        import vllm.v1.worker.gpu_worker as w
        from nemo_rl_attn_align.hosts import vllm_worker
        first = w.Worker.compile_or_warm_up_model
        bootstrap.activate("again"); vllm_worker.attach(); vllm_worker.register(); vllm_worker.register()
        from nemo_rl_attn_align.vocab.patching import is_wrapped
        print("wrapped once:", w.Worker.compile_or_warm_up_model is first and is_wrapped(first) and not is_wrapped(first.__wrapped__))
        print("finders:", sum(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path))
        print("origin:", bootstrap.origin)
        """  # noqa: E501 (the program, kept verbatim)
    )
    out = run_python(plugin_venv, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == [
        "host imported before: False",
        "wrapped once: True",
        "finders: 1",
        "origin: pth",
    ]


def test_broken_target_module_fails_as_without_plugin(plugin_venv, tmp_path):
    broken = tmp_path / "vllm" / "v1" / "worker"
    broken.mkdir(parents=True)
    for pkg in (tmp_path / "vllm", tmp_path / "vllm" / "v1", broken):
        (pkg / "__init__.py").write_text("")
    (broken / "gpu_worker.py").write_text("raise RuntimeError('vllm is broken here')\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import vllm.v1.worker.gpu_worker"
    with_plugin, without = run_python(plugin_venv, code), run_python(plugin_venv, code, NEMO_RL_ATTN_ALIGN="0")
    assert with_plugin.returncode == without.returncode == 1
    assert with_plugin.stderr.splitlines()[-1] == without.stderr.splitlines()[-1] == "RuntimeError: vllm is broken here"
    assert "nemo-rl-attn-align" not in with_plugin.stderr


def test_unrecognised_target_warns_once_and_import_goes_on(plugin_venv, tmp_path):
    odd = tmp_path / "vllm" / "v1" / "worker"
    odd.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    for pkg in (tmp_path / "vllm" / "v1", odd):
        (pkg / "__init__.py").write_text("")
    (odd / "gpu_worker.py").write_text("class GPUWorker:\n    pass\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import vllm.v1.worker.gpu_worker as w; "
        "import importlib; importlib.reload(w); print('imported', w.GPUWorker.__name__)"
    )
    out = run_python(plugin_venv, code)
    assert out.returncode == 0 and out.stdout.strip() == "imported GPUWorker"
    warnings = [line for line in out.stderr.splitlines() if "nemo-rl-attn-align" in line]
    assert (
        len(warnings) == 1
        and "vLLM 9.9.9" in warnings[0]
        and "Worker.compile_or_warm_up_model not found" in warnings[0]
    )
    strict = run_python(plugin_venv, code, NEMO_RL_ATTN_ALIGN_STRICT="1")
    assert (
        strict.returncode == 1
        and "HostLayoutError" in strict.stderr
        and "attention_align.strict is true" in strict.stderr
    )


def test_shim_reaches_an_env_without_the_plugin_and_chains(plugin_venv, tmp_path):
    other = make_bare_venv(tmp_path / "worker-venv")
    control = run_python(other, "import nemo_rl_attn_align")
    assert control.returncode == 1 and "No module named 'nemo_rl_attn_align'" in control.stderr
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("RAN = True\n")
    seen = probe(other, PYTHONPATH=os.pathsep.join([shim_dir(plugin_venv), str(user)]))
    assert seen["origin"] == "shim"
    assert seen["user_site_ran"] is True and seen["sitecustomize"] == str(user / "sitecustomize.py")
    off = run_python(
        other, PROBE, NEMO_RL_ATTN_ALIGN="0", PYTHONPATH=os.pathsep.join([shim_dir(plugin_venv), str(user)])
    )
    assert json.loads(off.stdout)["origin"] is None and json.loads(off.stdout)["user_site_ran"] is True


def test_existing_sitecustomize_in_the_plugin_env_still_runs(plugin_venv, tmp_path):
    site = site_packages(plugin_venv)
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    try:
        direct = probe(plugin_venv)  # no shim on PYTHONPATH: Python imports it itself
        via_shim = probe(plugin_venv, PYTHONPATH=shim_dir(plugin_venv))  # a child of an activated driver
    finally:
        (site / "sitecustomize.py").unlink()
    for seen in (direct, via_shim):
        assert seen["origin"] == "pth" and seen["user_site_ran"] is True
    assert via_shim["sitecustomize"] == str(site / "sitecustomize.py")


def test_vllm_entry_point_resolves_from_the_installed_package(plugin_venv):
    code = textwrap.dedent(
        """
        import sys
        from importlib.metadata import entry_points
        eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "nemo_rl_attn_align"]
        register = eps[0].load()
        for _ in range(3):
            register()   # vLLM calls it once per process; more must be harmless
        from nemo_rl_attn_align.hosts import bootstrap, vllm_worker
        print(len(eps), eps[0].value, register is vllm_worker.register,
              bootstrap._callbacks["vllm.v1.worker.gpu_worker"].count(vllm_worker._patch))
        """
    )
    out = run_python(plugin_venv, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "nemo_rl_attn_align.hosts.vllm_worker:register", "True", "1"]


def test_every_declared_seam_has_its_wrapper_and_its_hook_watches_it():
    import importlib

    from nemo_rl_attn_align.hosts.seams import HOOKS

    for name, declared in HOOKS.items():
        hook = importlib.import_module(f"nemo_rl_attn_align.hosts.{name}")
        assert hook._seams.declared is declared, name
        for seam in declared.seams:
            assert callable(getattr(hook, seam.wrapper, None)), (name, seam.wrapper)
            assert bootstrap.WATCHED[seam.module] == name and seam.module in hook._seams.modules


@pytest.mark.parametrize(
    "value,expected",
    [("0", False), ("off", False), ("False", False), (" no ", False), ("1", True), ("", True), ("yes", True)],
)
def test_switch_values(value, expected):
    assert bootstrap.enabled({bootstrap.SWITCH: value}) is expected
    assert bootstrap.enabled({}) is True


@pytest.mark.parametrize("shadow", ["raise RuntimeError('broken\\nsecond line')", "import sys; sys.exit(3)", ""])
def test_pth_never_prints_a_traceback_whatever_is_importable(plugin_venv, tmp_path, shadow):
    """A broken ``nemo_rl_attn_align`` earlier on sys.path (or one without the bootstrap): one line,
    the interpreter runs; switched off, not even that line (the .pth imports nothing then)."""
    package = tmp_path / "nemo_rl_attn_align"
    package.mkdir()
    (package / "__init__.py").write_text(shadow)
    on = run_python(plugin_venv, "print('ran')", PYTHONPATH=str(tmp_path))
    assert on.returncode == 0 and on.stdout == "ran\n"
    assert "Traceback" not in on.stderr and on.stderr.count("\n") == 1
    assert on.stderr.startswith("nemo-rl-attn-align: not active in this interpreter")
    off = run_python(plugin_venv, "print('ran')", PYTHONPATH=str(tmp_path), NEMO_RL_ATTN_ALIGN="0")
    assert (off.returncode, off.stdout, off.stderr) == (0, "ran\n", "")


class SlowToCompare:
    """A callback whose ``==`` lets other threads run: ``watch`` / ``unwatch`` compare callbacks
    between looking at the table and changing it, so without the lock two threads both act."""

    def __eq__(self, other):
        time.sleep(0.001)
        return self is other

    __hash__ = object.__hash__

    def __call__(self, module):
        pass


def test_the_callback_table_holds_under_concurrent_watch_and_unwatch(bootstrap_state):
    """Threads registering and forgetting the same callbacks at once: each callback ends up
    registered once, one finder on ``sys.meta_path``, no error on the way."""
    bootstrap_state.deactivate()
    name = "attn_align_test.never_imported"
    resident, callbacks = SlowToCompare(), [SlowToCompare() for _ in range(3)]
    bootstrap.watch(name, resident)  # every later membership test compares against it
    start, errors = threading.Barrier(4), []

    def churn():
        start.wait()
        try:
            for _ in range(5):
                for callback in callbacks:
                    bootstrap.watch(name, callback)
                for callback in callbacks:
                    bootstrap.unwatch(name, callback)
            for callback in callbacks:
                bootstrap.watch(name, callback)
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    table = bootstrap._callbacks[name]  # in whatever order the threads left it
    assert sorted(map(id, table)) == sorted(map(id, (resident, *callbacks)))
    assert sum(isinstance(f, bootstrap._PostImportFinder) for f in sys.meta_path) == 1


def test_a_watched_module_executes_with_its_real_loader_and_keeps_one_it_sets(bootstrap_state, tmp_path, monkeypatch):
    """As wrapt does: the real loader goes back before the module runs, and only where the import
    system had put our wrapper (a module that sets its own ``__loader__`` keeps it)."""
    import importlib

    names = ("attn_align_test_loader_seen", "attn_align_test_loader_own")
    (tmp_path / f"{names[0]}.py").write_text("SEEN = (type(__loader__).__name__, type(__spec__.loader).__name__)\n")
    (tmp_path / f"{names[1]}.py").write_text("class Own:\n    pass\n\n\n__loader__ = Own()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    notified: list = []
    for name in names:
        bootstrap.watch(name, notified.append)
    try:
        seen, own = (importlib.import_module(name) for name in names)
        assert seen.SEEN == ("SourceFileLoader", "SourceFileLoader")
        assert type(seen.__loader__).__name__ == "SourceFileLoader" and seen.__spec__.loader is seen.__loader__
        assert type(own.__loader__).__name__ == "Own"  # its own, not reset after it ran
        assert type(own.__spec__.loader).__name__ == "SourceFileLoader"
        assert notified == [seen, own]  # the watchers are still called once each
    finally:
        for name in names:
            sys.modules.pop(name, None)
