"""``check`` reads the recipe once: followed from the CLI to the verdict, the facts are read once,
config.json once and the tokenizer hashed once, however many rounds the preset and ``--fix`` run."""

from __future__ import annotations

import importlib
import json
from collections import Counter

import pytest

from nemo_rl_attn_align.cli import main
from tests.conftest import EXAMPLES

#: The shipped example (``preset: aligned``) and the stock recipe it comes from (no preset).
ALIGNED = str(EXAMPLES / "grpo_math_1B_megatron_flash.yaml")
STOCK = str(EXAMPLES / "grpo_math_1B_megatron_flash_mismatch.yaml")
#: The modules ``check`` runs through: every name they hold of a counted function is wrapped.
CHECK_PATH = (
    "nemo_rl_attn_align.cli.check",
    "nemo_rl_attn_align.aligning.fix",
    "nemo_rl_attn_align.kernels.kernel_choice",
    "nemo_rl_attn_align.aligning.preset",
    "nemo_rl_attn_align.binding.binding_preview",
    "nemo_rl_attn_align.contract.contract_preview",
    "nemo_rl_attn_align.kernels.kernel_prediction",
    "nemo_rl_attn_align.model.model_config",
    "nemo_rl_attn_align.model.model_facts",
    "nemo_rl_attn_align.preflight.plan",
    "nemo_rl_attn_align.preflight.recipe_facts",
    "nemo_rl_attn_align.preflight.tokenizer",
)
#: What is counted: the recipe's facts, config.json's lookup, the tokenizer's identity.
COUNTED = ("read_recipe_facts", "find_config", "tokenizer_identity")


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """How often each of ``COUNTED`` runs, wherever ``check`` calls it from."""
    counts: Counter = Counter()
    modules = [importlib.import_module(name) for name in CHECK_PATH]
    for name in COUNTED:
        real = next(getattr(m, name) for m in modules if getattr(m, name, None) is not None)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        for module in modules:
            if getattr(module, name, None) is real:
                monkeypatch.setattr(module, name, counted)
    return counts


@pytest.fixture
def tokenizer_dir(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    return tmp_path


def _check(capsys, *args: str) -> dict:
    code = main(["check", "--json", "--gpu", "sm90", *args])
    result = json.loads(capsys.readouterr().out)
    assert result["exit_code"] == code
    return result


def test_check_reads_the_recipe_once(reads, tokenizer_dir, capsys):
    result = _check(capsys, STOCK, f"policy.tokenizer.name={tokenizer_dir}")
    assert result["kernels"]["model"]["config"] is not None  # config.json was found and read
    tokenizer = result["attention_align"]["training"]["fields"]["tokenizer"]
    assert tokenizer["value"].startswith("sha256:")  # hashed, and the same hash on both sides
    assert result["attention_align"]["rollout"]["fields"]["tokenizer"]["value"] == tokenizer["value"]
    assert reads == {"read_recipe_facts": 1, "find_config": 1, "tokenizer_identity": 1}


def test_the_preset_and_fix_rounds_read_no_file_again(reads, tokenizer_dir, capsys):
    result = _check(capsys, "--fix", ALIGNED, f"policy.tokenizer.name={tokenizer_dir}")
    assert result["attention_align"]["preset"]["changes"] and result["fix"] is not None
    assert reads["read_recipe_facts"] > 2  # one reading of each config the rounds make
    assert (reads["find_config"], reads["tokenizer_identity"]) == (1, 1)
