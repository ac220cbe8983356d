"""The upstream-bug corpus: each attention bug NeMo-RL users reported, re-introduced into the real host
code at test time, caught by the plugin run as a user runs it (docs/upstream-bugs.md).

Its tests run where their host is, by marker: no marker, the base lane (``check`` on a recipe);
``real_nemo_rl``, lane nemo_rl (NeMo-RL's own recipes and packing); ``real_cross_engine``, .ci/run's
stage "cross-engine" (``step0``: the records of step 0 from both real engines, each in its own venv,
bound by ``report``). Elsewhere they skip with one line (``ATTN_ALIGN_TEST_REQUIRE_REAL=1`` turns
that skip into a failure).

``step0(name)`` runs every step-0 case once per session (``cases.py``), in three processes side by
side: one rollout process starting the engines of the bugs that live in training (``serve_many.py``),
one starting vLLM with #27722 re-introduced (``serve.py``), and the training sides
(``training_side.py``). Then each report folder gets the training record and the rollout record its
case pairs, and ``nemo-rl-attn-align report`` runs on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.real_cross_engine.conftest import ROLLOUT, TRAINING, missing_interpreters, skip_without_interpreters
from tests.real_nemo_rl.conftest import SNAPSHOTS_VARIABLE, snapshots_root
from tests.real_vllm.conftest import BASE_ARGS, IN_PROCESS, KV_CACHE_GIB, PROMPT
from tests.real_vllm.reverts import REVERT_ENV
from tests.upstream_bugs.cases import ENGINES, MODELS, REPORTS
from tests.upstream_bugs.cases import TRAINING as TRAINING_SIDES

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REAL_VLLM = REPO / "tests" / "real_vllm"
STAND_INS = REPO / "tests" / "real_nemo_rl" / "stand_ins"
#: The NeMo-RL ref whose worker path and recipe the training sides run.
REF = "7ea279a"
#: The first engine of a process records as this worker; the k-th later one as ``-engine<k>``.
FIRST_ENGINE = "vllm-rank0-worker0"


def pytest_collection_modifyitems(config, items):
    """Skip the step-0 tests, with one line, where the two interpreters or NeMo-RL's sources are missing."""
    skip_without_interpreters(items, HERE)
    if missing_interpreters() is None and snapshots_root() is None:
        for item in items:
            if HERE in Path(str(item.fspath)).parents and item.get_closest_marker("real_cross_engine"):
                item.add_marker(pytest.mark.skip(reason=f"{SNAPSHOTS_VARIABLE} does not name NeMo-RL's sources"))


@dataclass(frozen=True)
class Report:
    """One report folder of step 0 and what ``nemo-rl-attn-align report`` made of it."""

    folder: Path
    exit_code: int
    text: str
    doc: dict[str, Any]

    def finding(self, code: str, field: str) -> dict[str, Any] | None:
        """The report's finding ``code`` on contract field ``field`` (None: there is none)."""
        found = [f for f in self.doc["findings"] if f["code"] == code and f["key"].rsplit(".", 1)[-1] == field]
        assert len(found) <= 1, found
        return found[0] if found else None

    def line(self, code: str, field: str) -> str:
        """The line ``report`` printed for that finding."""
        [line] = [line for line in self.text.splitlines() if f" {code}: " in line and f".{field}=" in line]
        return line

    def row(self, field: str) -> dict[str, Any]:
        """The binding's row of ``field``."""
        [row] = [r for r in self.doc["binding"]["fields"] if r["field"] == field]
        return row


def _run(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``command`` in the repository, this checkout's plugin first on its path (a lane's venv has it
    installed; the hooks the entry point and the ``.pth`` load are this checkout's)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_RL_ATTN_ALIGN", "VLLM_"))}
    env = {"PYTHONPATH": str(REPO), **env}
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=REPO, env={**clean, **env}, stdout=out, stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, log: Path, timeout: int = 1200) -> str:
    returncode = proc.wait(timeout=timeout)
    text = log.read_text()
    assert returncode == 0, f"{proc.args[:3]} exited {returncode}:\n{text[-6000:]}"
    return text


def _rollout_files(folder: Path, worker_id: str) -> list[Path]:
    return [folder / kind / f"rollout--{worker_id}.json" for kind in ("workers", "hosts", "claims")]


class Step0:
    """Every case of ``cases.py`` run once; ``report(name)`` binds one report folder."""

    def __init__(self, root: Path, training_python: str, rollout_python: str):
        self.root = root
        started = time.monotonic()
        models = {name: root / "models" / name for name in MODELS}
        made = subprocess.run(
            [rollout_python, "-c", _MAKE_MODELS, json.dumps({n: [str(models[n]), *MODELS[n]] for n in MODELS})],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert made.returncode == 0, made.stderr[-4000:]
        self.rollout: dict[str, tuple[Path, str]] = {}
        running = [self._serve_fixed(rollout_python, models), *self._serve_reverted(rollout_python, models)]
        running.append(self._train(training_python, models))
        self.logs = {log.name: _wait(proc, log) for proc, log in running}
        self.training_errors = json.loads((root / "training.json").read_text())
        self.seconds = time.monotonic() - started
        self._reports: dict[str, Report] = {}

    def _serve_fixed(self, python: str, models: dict[str, Path]) -> tuple[subprocess.Popen, Path]:
        """The engines with vLLM as installed, one after another in one process (``serve_many.py``)."""
        folder = self.root / "rollout" / "installed"
        fixed = [name for name, (_, revert) in ENGINES.items() if revert is None]
        for k, name in enumerate(fixed):
            self.rollout[name] = (folder, FIRST_ENGINE + (f"-engine{k}" if k else ""))
        spec = {
            "engines": [{"model": str(models[ENGINES[n][0]]), "engine": BASE_ARGS} for n in fixed],
            "prompt": PROMPT,
        }
        env = {"NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(folder), "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, **IN_PROCESS}
        log = self.root / "rollout-installed.log"
        return _run([python, str(REAL_VLLM / "serve_many.py"), json.dumps(spec)], env, log), log

    def _serve_reverted(self, python: str, models: dict[str, Path]) -> list[tuple[subprocess.Popen, Path]]:
        """Each engine with a vLLM fix taken back out, in a process of its own (``serve.py``)."""
        out = []
        for name, (model, revert) in ENGINES.items():
            if revert is None:
                continue
            folder = self.root / "rollout" / name
            self.rollout[name] = (folder, FIRST_ENGINE)
            spec = {"model": str(models[model]), "engine": BASE_ARGS, "prompt": PROMPT}
            env = {
                "NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(folder),
                "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
                REVERT_ENV: revert,
                **IN_PROCESS,
            }
            log = self.root / f"rollout-{name}.log"
            out.append((_run([python, str(REAL_VLLM / "serve.py"), json.dumps(spec)], env, log), log))
        return out

    def _train(self, python: str, models: dict[str, Path]) -> tuple[subprocess.Popen, Path]:
        cases = [
            {
                "name": name,
                "checkpoint": str(models[model]),
                "report_dir": str(self.root / "training" / name),
                "revert": revert,
                "overrides": list(overrides),
            }
            for name, (model, revert, overrides) in TRAINING_SIDES.items()
        ]
        tree = snapshots_root() / REF  # type: ignore[operator]
        spec = {"cases": cases, "out": str(self.root / "training.json")}
        command = [python, "-m", "tests.upstream_bugs.training_side", str(tree), json.dumps(spec)]
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(STAND_INS)]), "NEMO_RL_ATTN_ALIGN": "1"}
        log = self.root / "training.log"
        return _run(command, env, log), log

    def report(self, name: str) -> Report:
        """Report folder ``name`` of ``cases.REPORTS``: its records copied in, then ``report`` (text and JSON)."""
        if name not in self._reports:
            training, engine = REPORTS[name]
            assert self.training_errors[training] is None, self.training_errors[training]
            folder = self.root / "reports" / name
            shutil.copytree(self.root / "training" / training, folder)
            rollout_folder, worker_id = self.rollout[engine]
            for path in _rollout_files(rollout_folder, worker_id):
                (folder / path.parent.name).mkdir(exist_ok=True)
                shutil.copy(path, folder / path.parent.name / path.name)
            command = [sys.executable, "-m", "nemo_rl_attn_align", "report", str(folder)]
            text = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
            doc = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
            assert text.returncode == doc.returncode, doc.stderr
            self._reports[name] = Report(folder, text.returncode, text.stdout, json.loads(doc.stdout))
        return self._reports[name]


#: Run by the rollout venv's interpreter: the tiny models of ``cases.MODELS`` (name -> [dir, architecture, overrides]).
_MAKE_MODELS = """
import json, sys
from pathlib import Path
from tests.real_vllm.tiny_models import make_model
for directory, architecture, overrides in json.loads(sys.argv[1]).values():
    make_model(Path(directory), architecture, overrides=overrides)
"""


@pytest.fixture(scope="session")
def step0(tmp_path_factory) -> Step0:
    """The step-0 runs of every case (``Step0``), once per session."""
    return Step0(tmp_path_factory.mktemp("upstream-bugs"), os.environ[TRAINING], os.environ[ROLLOUT])
