"""What ``check --json`` and ``report --json`` print, over the shipped examples and NeMo-RL's recipes,
kept so that a refactoring can show it changed no behaviour (``tests/test_golden_outputs.py``).

The outputs are taken in this process, through the CLI's own ``main``, with one fixed environment
(``EXAMPLE_MODELS`` in a Hugging Face cache, no ``nvidia-smi``, no NVTE_* variables); paths that differ
between machines are replaced by placeholders. ``python -m tests.golden_outputs`` writes them anew
(with ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS set, for the recipes): do so only for a change of behaviour
that is meant, and say so in the commit.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "golden_outputs.json.xz"
#: NeMo-RL's recipes are read at this ref of the snapshots.
NEMO_RL_REF = "7ea279a"
#: What each config is checked with, beside the plain ``check --json``.
CHECK_VARIANTS = {"": [], "H100": ["--gpu", "H100"], "B200": ["--gpu", "B200"]}
#: Only for the shipped examples: a GPU without FlashAttention 2 for head dims over 192, the preset's search.
EXAMPLE_ONLY_VARIANTS = {"L40S": ["--gpu", "L40S"], "fix": ["--fix"], "fix-B200": ["--fix", "--gpu", "B200"]}


def recipe_root() -> Path | None:
    """NeMo-RL's example configs at ``NEMO_RL_REF`` (None without the snapshots)."""
    snapshots = os.environ.get("ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS")
    root = Path(snapshots) / NEMO_RL_REF / "examples" / "configs" if snapshots else None
    return root if root is not None and root.is_dir() else None


def _configs() -> Iterator[tuple[str, Path, Path]]:
    """(label, folder to run in, config path relative to it) for every config compared."""
    examples = REPO / "examples" / "configs"
    for path in sorted(examples.glob("*.yaml")):
        yield f"examples/{path.name}", examples, Path(path.name)
    root = recipe_root()
    if root is not None:
        for path in sorted(root.glob("*.yaml")) + sorted((root / "recipes" / "llm").glob("*.yaml")):
            yield f"nemo-rl/{path.relative_to(root)}", root, path.relative_to(root)


@contextlib.contextmanager
def _fixed_environment(hf_cache: Path, cwd: Path) -> Iterator[None]:
    """``os.environ`` as the outputs were taken with, and ``cwd`` as the working directory."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update({"HF_HUB_CACHE": str(hf_cache), "PATH": "/nonexistent", "HOME": "/nonexistent"})
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _run_cli(argv: list[str], hf_cache: Path, cwd: Path) -> str:
    """What ``nemo-rl-attn-align ARGV`` prints (stdout, then the exit code), paths made portable."""
    from nemo_rl_attn_align.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _fixed_environment(hf_cache, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = f"{out.getvalue()}\nexit {code}\n{err.getvalue()}"
    return text.replace(str(hf_cache), "<HF_HUB_CACHE>").replace(str(cwd), "<CWD>")


def check_outputs(hf_cache: Path) -> dict[str, str]:
    """``check --json`` over every config and variant, keyed ``label [variant]``."""
    outputs = {}
    for label, cwd, path in _configs():
        variants = dict(CHECK_VARIANTS, **(EXAMPLE_ONLY_VARIANTS if label.startswith("examples/") else {}))
        for variant, args in variants.items():
            outputs[f"{label} [{variant}]"] = _run_cli(["check", "--json", *args, str(path)], hf_cache, cwd)
    return outputs


def _report_cases() -> dict[str, dict]:
    """Rollout changes against the sample training contract, one report each."""
    from nemo_rl_attn_align.contract.contract import FieldValue

    return {
        "aligned": {},
        "dtype differs": {"dtype": FieldValue.observed("fp32")},
        "split-kv heuristic": {"split_kv_policy": FieldValue.observed("heuristic")},
        "reduction order differs": {"reduction_order": FieldValue.observed("split_kv")},
    }


def _expected_workers() -> dict:
    """The workers the report expects: one per side, as a config would say."""
    from nemo_rl_attn_align.preflight.expected_workers import ExpectedSide

    return {"training": ExpectedSide(1, ("policy-0",), "golden"), "rollout": ExpectedSide(1, ("vllm-0",), "golden")}


def report_outputs(hf_cache: Path) -> dict[str, str]:
    """``report --json`` and ``report --all`` over reports of the sample contracts."""
    from nemo_rl_attn_align.binding.determinism_probe import probe
    from nemo_rl_attn_align.config.settings import AlignSettings
    from nemo_rl_attn_align.report.document import RunDescription, collect, write_report
    from nemo_rl_attn_align.report.store import write_worker_record
    from nemo_rl_attn_align.vocab.mandate import Mandate
    from tests.contract_samples import MANDATE_OF_SAMPLES, full_contract

    settings = AlignSettings(mandate=Mandate(**MANDATE_OF_SAMPLES))
    outputs = {}
    for name, changes in _report_cases().items():
        with tempfile.TemporaryDirectory() as folder:
            report_dir = Path(folder)
            write_worker_record(report_dir, full_contract("training", "policy-0"), probe({}, torch_module=False))
            write_worker_record(
                report_dir, full_contract("rollout", "vllm-0", **changes), probe({}, torch_module=False)
            )
            doc = collect(report_dir, settings, RunDescription(expected=_expected_workers()))
            path = write_report(report_dir, doc)
            for variant, args in {"json": ["--json"], "all": ["--all"]}.items():
                text = _run_cli(["report", *args, str(path)], hf_cache, report_dir)
                outputs[f"report {name} [{variant}]"] = _portable_report(text, doc)
    return outputs


def _portable_report(text: str, doc: dict) -> str:
    """``text`` with the report's run id and times (new every collection) replaced by placeholders."""
    for key in ("run_id", "created", "collected_at", "created_at"):
        value = doc.get(key)
        if isinstance(value, str) and value:
            text = text.replace(value, f"<{key}>")
    return text


def all_outputs(hf_cache: Path) -> dict[str, str]:
    """Every output compared, keyed by case."""
    return {**check_outputs(hf_cache), **report_outputs(hf_cache)}


def read_golden() -> dict[str, str]:
    """The outputs as last written."""
    return json.loads(lzma.decompress(GOLDEN.read_bytes()))


def write_golden(hf_cache: Path) -> int:
    """Take every output anew and write them; returns how many."""
    outputs = all_outputs(hf_cache)
    if recipe_root() is None:
        raise SystemExit("set ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS: the golden outputs cover NeMo-RL's recipes")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_bytes(lzma.compress(json.dumps(outputs, indent=0, sort_keys=True).encode(), preset=9))
    return len(outputs)


if __name__ == "__main__":
    from tests.example_models import write_example_model_cache

    with tempfile.TemporaryDirectory() as cache:
        if write_example_model_cache(Path(cache)) is None:
            sys.exit("transformers is needed to write the example models")
        print(f"wrote {write_golden(Path(cache))} outputs to {GOLDEN.relative_to(REPO)}")
