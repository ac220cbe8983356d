"""The model's files as hostile input (issue #40): each case the issue found, then a sample of the
generated hostile models (``tests/hostile_models.py``), through the real CLI.

Every unusable input is one line on stderr and exit 2, naming the file or key, the value and the
limit; a usable one (a value within its limits, a file that is not there) exits 0 or 1; nothing is a
traceback. Times and memory of the same cases are measured by ``benchmarks/hostile_models.py``, not here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.preflight.tokenizer import tokenizer_identity
from nemo_rl_attn_align.vocab.limits import MAX_TOKENIZER_HASH_BYTES

from . import hostile_inputs as hi
from . import hostile_models as hm
from .conftest import REPO

EXAMPLE = default_example_path()


@pytest.fixture(scope="module")
def models():
    """A world-readable folder for models (pytest's own tmp_path is not, to a process without the
    permission override), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="hostile-models-") as folder:
        root = Path(folder)
        root.chmod(0o755)
        yield root


def check_cli(*overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``nemo-rl-attn-align check EXAMPLE OVERRIDES`` in a fresh process without root's permission
    override (so a file of mode 000 is unreadable to it, as to any user)."""
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_attn_align", "check", str(EXAMPLE), *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        preexec_fn=hm.without_file_permission_override,
    )


def one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr
    return done.stderr


def write_config(folder: Path, config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return folder


QWEN2 = hm.base_config("Qwen2ForCausalLM")


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("deep", "[" * 100_000 + "]" * 100_000, "nests deeper than 32 levels"),
        ("float", json.dumps({**QWEN2, "num_hidden_layers": 2.5}), "num_hidden_layers=2.5 is a float"),
        ("string", json.dumps({**QWEN2, "num_hidden_layers": "28"}), "num_hidden_layers='28' is a string"),
        (
            "infinite",
            json.dumps(QWEN2)[:-1] + ', "num_hidden_layers": 1e999}',
            "num_hidden_layers=inf is a float",
        ),
        ("hundred million", json.dumps({**QWEN2, "num_hidden_layers": 10**8}), "=100000000 is not an integer"),
        ("malformed", "{not json", "is not valid JSON"),
    ],
)
def test_each_config_json_the_issue_found_is_one_line_and_exit_2(models, name, text, said):
    folder = write_config(models / name, text)
    line = one_line_exit_2(check_cli(f"policy.model_name={folder}"))
    assert said in line and str(folder / "config.json") in line


def test_missing_unreadable_and_malformed_config_json_are_three_messages(models):
    folder = models / "three"
    folder.mkdir()
    missing = check_cli(f"policy.model_name={folder}")
    assert missing.returncode == 0 and "no " + str(folder / "config.json") + " on this machine" in missing.stdout
    write_config(folder, json.dumps(QWEN2)).joinpath("config.json").chmod(0)
    assert "cannot be read (Permission denied)" in one_line_exit_2(check_cli(f"policy.model_name={folder}"))
    (folder / "config.json").chmod(0o644)
    (folder / "config.json").write_text("[")
    assert "is not valid JSON" in one_line_exit_2(check_cli(f"policy.model_name={folder}"))
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    assert "is a FIFO (named pipe), not a regular file" in one_line_exit_2(check_cli(f"policy.model_name={folder}"))


def test_an_unreadable_tokenizer_is_one_line_and_a_huge_one_is_hashed_in_part(models):
    folder = write_config(models / "tokenizer", json.dumps(QWEN2))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer.json").chmod(0)
    line = one_line_exit_2(check_cli(f"policy.model_name={folder}"))
    assert "tokenizer" in line and str(folder / "tokenizer.json") in line and "Permission denied" in line
    (folder / "tokenizer.json").unlink()
    with open(folder / "tokenizer.json", "wb") as handle:  # 2 GiB, sparse: read only as far as the limit
        handle.truncate(2 << 30)
    identity = tokenizer_identity(str(folder))
    assert identity.identity.startswith("sha256:") and f"first {MAX_TOKENIZER_HASH_BYTES} bytes" in identity.how
    assert check_cli(f"policy.model_name={folder}").returncode == 0


def test_a_tokenizer_in_the_hub_cache_counts_by_its_blob_and_equals_a_copy_elsewhere(models):
    blob = models / "hub-tok" / "blobs"
    blob.mkdir(parents=True)
    content = b'{"model": {"vocab": {"a": 0}}}'
    (blob / hashlib.sha256(content).hexdigest()).write_bytes(content)
    snapshot = models / "hub-tok" / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").symlink_to(blob / hashlib.sha256(content).hexdigest())
    copy = models / "tok-copy"
    copy.mkdir()
    (copy / "tokenizer.json").write_bytes(content)
    cached, copied = tokenizer_identity(str(snapshot)), tokenizer_identity(str(copy))
    assert cached.identity == copied.identity and "Hugging Face cache's sha256" in cached.how


@pytest.mark.parametrize(
    "override, said",
    [
        ("++policy.hf_config_overrides.num_hidden_layers=2.5", "policy.hf_config_overrides.num_hidden_layers=2.5"),
        ("++policy.megatron_cfg.model_overrides.num_layers=100000000", "model_overrides.num_layers=100000000"),
        ("++policy.generation.vllm_kwargs.hf_overrides.head_dim=true", "hf_overrides.head_dim=True is a boolean"),
    ],
)
def test_a_recipe_override_of_a_model_value_has_the_same_limits(models, override, said):
    folder = write_config(models / "qwen2", json.dumps(QWEN2))
    outcome = hi.run_check(EXAMPLE, [f"policy.model_name={folder}", override])
    assert outcome.problems == [] and outcome.exit_code == 2 and said in outcome.stderr


def _sound(case: hm.ModelCase, code, stdout: str, stderr: str) -> None:
    """A generated case's outcome: exit 2 in one line where unusable, else 0 or 1; never a traceback."""
    where = f"{case.label}: exit {code}; {(stderr or stdout)[-600:]}"
    assert "Traceback" not in stderr, where
    if case.unusable is not None:
        assert code == 2 and stderr.count("\n") == 1, where
    else:
        assert code in (0, 1), where


def test_generated_hostile_models_in_this_process(models, monkeypatch):
    """Two hundred generated cases through the CLI's entry point (cases that need a file of mode
    000 to be unreadable run in the subprocess test)."""
    cases = hm.write_cases(models / "in-process", 200, seed=40)
    monkeypatch.setenv("HF_HUB_CACHE", str(models / "in-process" / "hub"))
    for case in cases:
        if not case.mode_000:
            outcome = hi.run_check(EXAMPLE, case.overrides)
            assert outcome.exception is None, (case.label, outcome.problems)
            _sound(case, outcome.exit_code, outcome.stdout, outcome.stderr)


def test_generated_hostile_models_as_real_processes(models):
    """A sample of generated cases (every family) as ``nemo-rl-attn-align check`` processes."""
    cases = hm.write_cases(models / "processes", 24, seed=41)
    for case in cases:
        done = check_cli(*case.overrides, env={"HF_HUB_CACHE": str(models / "processes" / "hub")})
        _sound(case, done.returncode, done.stdout, done.stderr)
