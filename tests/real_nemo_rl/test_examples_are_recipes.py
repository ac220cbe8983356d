"""The shipped examples are recipes NeMo-RL itself accepts: its loader, its ``MasterConfig``, its launcher.

For each ref of ``VALIDATION_REFS`` one subprocess (the source tree on ``PYTHONPATH``, the plugin
active) does with each shipped example what ``examples/run_grpo.py`` / ``run_sft.py`` do before the
first worker starts (NVIDIA-NeMo/RL at 7ea279a, ``main()``): NeMo-RL's own ``load_config``
(``defaults:`` relative to the file), ``OmegaConf.to_container(resolve=True)``, ``MasterConfig(**config)``
of the algorithm, then the keys the launcher reads on the object it built. It prints one JSON line
per example; the test asserts on them. At 7ea279a the examples must also hold every key of the NeMo-RL recipe each
one follows (values may differ), so nothing a launcher or ``setup`` reads there is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES

from .conftest import VALIDATION_REFS, snapshot

pytestmark = pytest.mark.real_nemo_rl

#: example -> (algorithm module, the NeMo-RL recipe it follows, under examples/configs).
EXAMPLE_RECIPES = {
    "grpo_math_1B_megatron_flash.yaml": ("grpo", "grpo_math_1B_megatron.yaml"),
    "grpo_math_1B_megatron_flash_mismatch.yaml": ("grpo", "grpo_math_1B_megatron.yaml"),
    "sft_megatron_flash.yaml": ("sft", "sft_openmathinstruct2_megatron.yaml"),
}

#: What runs in the NeMo-RL tree: argv[1] = JSON list of [algorithm, example path, upstream recipe path].
_LAUNCHER_STEPS = r"""
import importlib, json, sys
from omegaconf import OmegaConf
from nemo_rl.utils.config import load_config, register_omegaconf_resolvers

register_omegaconf_resolvers()

def paths(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, f"{prefix}{key}.")
    yield prefix.rstrip(".")

def launcher_steps(algorithm, path, upstream):
    MasterConfig = importlib.import_module(f"nemo_rl.algorithms.{algorithm}").MasterConfig
    errors, reads = [], {}
    raw = OmegaConf.to_container(load_config(path), resolve=True)
    try:
        config = MasterConfig(**raw)
    except Exception as err:  # pydantic's ValidationError: every error, as NeMo-RL's own test lists them
        errors = [
            ".".join(map(str, e["loc"])) + ": " + e["msg"] for e in getattr(err, "errors", lambda: [])()
        ] or [repr(err)]
    else:
        # run_grpo.py / run_sft.py main() at 7ea279a, before setup(): these lookups must not raise.
        reads["log_dir"] = config.logger["log_dir"]
        reads["checkpointing"] = config.checkpointing["enabled"] and config.checkpointing["checkpoint_dir"]
        reads["tokenizer"] = config.policy["tokenizer"]["name"]
        reads["megatron_cfg"] = (config.policy.get("megatron_cfg") or {}).get("mtp_num_layers")
        reads["data"] = sorted(config.data)
        if algorithm == "grpo":
            reads["generation"] = config.policy["generation"]["backend"]
            reads["draft"] = bool(config.policy["draft"]["enabled"])
            reads["env"] = sorted(config.env)
            grpo = config.grpo  # a pydantic model at 7ea279a, a dict at v0.7.0 (whose launcher tests the key)
            reads["async_grpo"] = bool(grpo.async_grpo.enabled if hasattr(grpo, "async_grpo")
                                       else "async_grpo" in grpo and grpo["async_grpo"]["enabled"])
            reads["data_plane"] = bool((config.data_plane or {}).get("enabled", False))
            reads["multiple_dataloader"] = config.data["use_multiple_dataloader"]
        reads["attention_align"] = raw.get("attention_align")

    mine = set(paths(OmegaConf.to_container(load_config(path), resolve=False)))
    theirs = set(paths(OmegaConf.to_container(load_config(upstream), resolve=False)))
    return {"errors": errors, "reads": reads, "missing": sorted(theirs - mine)}

for args in json.loads(sys.argv[1]):
    print(json.dumps(launcher_steps(*args)))
"""


def _run_launcher_steps(tree) -> dict[str, dict]:
    """example -> what the launcher steps gave, for every shipped example, in one process of ``tree``."""
    names = sorted(EXAMPLE_RECIPES)
    jobs = [
        [EXAMPLE_RECIPES[n][0], str(EXAMPLES / n), str(tree / "examples/configs" / EXAMPLE_RECIPES[n][1])]
        for n in names
    ]
    env = dict(os.environ, PYTHONPATH=str(tree), RAY_ADDRESS="local")
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCHER_STEPS, json.dumps(jobs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"at {tree.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return dict(zip(names, (json.loads(line) for line in proc.stdout.strip().splitlines()[-len(names) :]), strict=True))


def test_every_shipped_example_is_covered():
    assert sorted(EXAMPLE_RECIPES) == sorted(p.name for p in EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("ref", VALIDATION_REFS)
def test_examples_pass_masterconfig_and_the_launchers_reads(ref):
    for example, result in _run_launcher_steps(snapshot(ref)).items():
        assert result["errors"] == [], f"NeMo-RL {ref} MasterConfig rejects {example}: {result['errors']}"
        reads = result["reads"]
        assert reads["log_dir"].startswith("logs/") and reads["attention_align"], (example, reads)
        if EXAMPLE_RECIPES[example][0] == "grpo":
            assert reads["generation"] == "vllm" and reads["draft"] is False, (example, reads)
        if ref == "7ea279a":
            assert result["missing"] == [], f"{example} lacks keys of NeMo-RL's {EXAMPLE_RECIPES[example][1]}"
