"""``check``'s behaviour preview: each side's ``rope``, ``mask`` and ``softmax`` computed before launch
by its host's own code, in its own process (``hosts/behaviour_preview.py``), never in ``check``'s.

Asked for with ``--training-python PY`` / ``--rollout-python PY`` (the venvs NeMo-RL's workers run
in: ``cli/host_pythons.py``, the flags ``probe`` takes) or ``--behaviour`` (this Python, where it has
the host). Each side is read from the recipe as the run starts (``probe.recipe``: the preset applied,
``policy.hf_config_overrides`` / ``vllm_kwargs.hf_overrides``, the precision and Megatron settings,
each worker's ``env_vars``) on the directory of the ``config.json`` check read; both sides run at
once. What comes back is ``RecipeFacts.behaviour`` (``preflight.behaviour_facts``), which the preview
sets as ``configured``; a side that cannot be computed says why and stays pending. An interpreter
given on the command line that lacks its host is a ``UsageError`` (exit 2).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_attn_align.cli import host_pythons
from nemo_rl_attn_align.preflight.behaviour_facts import FLAGS, ComputedBehaviour
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.errors import UsageError

if TYPE_CHECKING:
    from nemo_rl_attn_align.preflight.recipe_facts import RecipeFacts

#: The module each side's process runs.
MODULE = "nemo_rl_attn_align.hosts.behaviour_preview"
#: side -> the module its host imports as (this Python is asked for it before a process starts).
HOST_MODULES = {"training": "megatron.bridge", "rollout": "vllm"}
#: How long one side may take (vLLM imports for tens of seconds on 2 shared cores).
TIMEOUT_S = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--training-python``, ``--rollout-python`` and ``--behaviour``."""
    host_pythons.add_arguments(parser, "computes its rope, mask and softmax before launch")
    parser.add_argument(
        "--behaviour",
        action="store_true",
        help="compute each side's rope, mask and softmax with the hosts' own code (Megatron-Bridge, vLLM) in "
        "this Python where it has them (--training-python / --rollout-python name other venvs); "
        "tens of seconds",
    )


def requested(args: argparse.Namespace) -> dict[str, str | None] | None:
    """Side -> the interpreter named on the command line (None: this one), or None where no behaviour
    was asked for; a ``UsageError`` for a flag that names no executable."""
    pythons = {side: host_pythons.interpreter(getattr(args, f"{side}_python", None), side) for side in FLAGS}
    if not getattr(args, "behaviour", False) and not any(pythons.values()):
        return None
    return pythons


def compute(facts: RecipeFacts, pythons: Mapping[str, str | None]) -> RecipeFacts:
    """``facts`` (the recipe as the run starts) with the behaviour each bound side's host computed for it."""
    from nemo_rl_attn_align.contract.contract_preview import absent_sides

    absent = absent_sides(facts)
    specs, results = {}, {}
    for side in (s for s in FLAGS if s not in absent):
        python = pythons.get(side) or sys.executable
        found = _side(facts, side)
        if isinstance(found, str):
            results[side] = ComputedBehaviour(side, python, why_not=found)
        elif pythons.get(side) is None and not _has_host(side):
            why = f"this Python has no {HOST_MODULES[side]}; pass {FLAGS[side]} PY"
            results[side] = ComputedBehaviour(side, python, why_not=why)
        else:
            specs[side] = replace(found, python=python)
    results.update(_run(specs, explicit={side for side in specs if pythons.get(side)}))
    return replace(facts, behaviour=tuple(results[side] for side in FLAGS if side in results))


def _side(facts: RecipeFacts, side: str) -> Any:
    """The probe side file of ``side`` on the directory of the config.json check read, or why not."""
    from nemo_rl_attn_align.probe.recipe import rollout_side, training_side

    if facts.model.config is None:
        return f"no config.json to build the model from: {facts.model.unread}"
    if side == "rollout" and facts.megatron_generation is not None:
        return "the rollout generates with Megatron (check computes a vLLM rollout's)"
    try:
        spec, _ = (training_side if side == "training" else rollout_side)(facts, str(facts.model.config.path.parent))
    except UsageError as err:
        return str(err)
    return spec


def _has_host(side: str) -> bool:
    """Whether this Python finds ``side``'s host module, importing nothing of it (not even ``megatron``)."""
    import importlib.machinery
    import importlib.util

    top, _, sub = HOST_MODULES[side].partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not sub:
        return spec is not None
    return importlib.machinery.PathFinder.find_spec(f"{top}.{sub}", spec.submodule_search_locations) is not None


def _run(specs: Mapping[str, Any], explicit: set[str]) -> dict[str, ComputedBehaviour]:
    """Each side's process, all at once; what each wrote (``explicit``: sides whose interpreter the
    command line named, where a missing host is a ``UsageError``)."""
    from nemo_rl_attn_align.probe.sides import environment

    results = {}
    with tempfile.TemporaryDirectory(prefix="attn-align-behaviour-") as scratch:
        running = {}
        for side, spec in specs.items():
            side_file, out = Path(scratch) / f"{side}.side.json", Path(scratch) / f"{side}.json"
            side_file.write_text(spec.to_json(), encoding="utf-8")
            env = {**environment(spec, Path(scratch)), "NEMO_RL_ATTN_ALIGN": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            command = [spec.python, "-m", MODULE, str(side_file), str(out)]
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            running[side] = (process, out, spec.python)
        try:
            for side, (process, out, python) in running.items():
                results[side] = _wait(side, process, out, python, side in explicit)
        finally:  # a side that raised leaves none running
            for process, _, _ in running.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return results


def _wait(side: str, process: subprocess.Popen, out: Path, python: str, explicit: bool) -> ComputedBehaviour:
    """What ``side``'s process computed, or why not; a ``UsageError`` where the interpreter the command
    line named (``explicit``) lacks its host."""
    try:
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return ComputedBehaviour(side, python, why_not=f"did not finish in {TIMEOUT_S} s")
    last = (stderr.strip().splitlines() or ["no output"])[-1][:600]
    if process.returncode == 2 and explicit:
        raise UsageError(f"{FLAGS[side]} {python}: {last.removeprefix('error: ')}")
    if process.returncode != 0:
        return ComputedBehaviour(side, python, why_not=f"exit {process.returncode}: {last}")
    return _read(side, python, out)


def _read(side: str, python: str, out: Path) -> ComputedBehaviour:
    """What a side's process wrote to ``out``."""
    try:
        answer = jsonio.loads(out.read_text(encoding="utf-8"), str(out))
    except (OSError, ValueError) as err:
        return ComputedBehaviour(side, python, why_not=f"its answer could not be read ({err})")
    if not isinstance(answer, dict) or ("error" not in answer and not isinstance(answer.get("fields"), dict)):
        return ComputedBehaviour(side, python, why_not="its answer is not a preview")
    if "error" in answer:
        return ComputedBehaviour(side, python, why_not=f"the host could not build the model: {answer['error']}")
    return ComputedBehaviour(
        side,
        python,
        host=str(answer.get("host")),
        fields=answer["fields"],
        substitutions=tuple(map(str, answer.get("substitutions", ()))),
        problems=tuple(map(str, answer.get("problems", ()))),
        seconds=answer.get("seconds"),
    )
