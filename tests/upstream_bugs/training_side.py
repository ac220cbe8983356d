"""The training sides of the upstream-bug corpus, each as a NeMo-RL run builds it, with the plugin on:
``python -m tests.upstream_bugs.training_side TREE SPEC_JSON`` (lane nemo_rl's venv: Megatron-Bridge
0.6.2, megatron-core 0.19.2; ``TREE`` a NeMo-RL source tree, put after the repository and the
stand-ins on the path: it has a ``tests`` package of its own).

``SPEC_JSON``: ``{"cases": [{"name", "checkpoint": dir (config.json and tokenizer), "report_dir",
"revert": a key of bridge_reverts.REVERTS or null, "overrides": [Hydra overrides]}], "out": file}``. Per case, with
the revert in force throughout (NeMo-RL's import of the checkpoint and the build both run the
installed Megatron-Bridge's code):

1. ``iter_0000000/run_config.yaml`` as NeMo-RL's HF import writes it (``real_worker.write_run_config``:
   the provider Megatron-Bridge makes of ``config.json``);
2. NeMo-RL's own worker path (``validate_and_set_config`` -> ``setup_model_config`` ->
   ``_apply_performance_config``) with the tree's GRPO recipe and the case's overrides, through the
   hook the plugin's ``.pth`` attached: it records the model config;
3. the model that configuration provides, built on the CPU (``bridge_behaviour.build_on_cpu``: NeMo-RL's
   ``setup_model_and_optimizer`` builds through DDP on CUDA), handed to the hook as that function's
   wrapper hands it (``megatron_worker._after_model_built``): it reads the live modules' rope, mask
   and softmax and writes the record of step 0.

Each case gets a fresh hook record. Writes ``out``: case -> the error that stopped it (null).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any


def _checkpoint(source: Path, directory: Path) -> Path:
    """``source``'s config.json and tokenizer (not its weights: the model is built with random ones)
    in ``directory``, with the run config NeMo-RL's HF import writes beside them."""
    from transformers import AutoConfig

    from tests.gpu import real_worker

    directory.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, directory / path.name)
    return real_worker.write_run_config(directory, AutoConfig.from_pretrained(directory))


def run_case(tree: Path, case: dict[str, Any], workdir: Path) -> None:
    from nemo_rl_attn_align.hosts import megatron_worker
    from tests.gpu import real_worker
    from tests.real_nemo_rl.bridge_behaviour import build_on_cpu
    from tests.upstream_bugs.bridge_reverts import reverted

    worker = importlib.import_module(real_worker.WORKER)
    megatron_worker.record = megatron_worker.TrainingRecord()
    os.environ["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] = case["report_dir"]
    with reverted(case["revert"]):
        checkpoint = _checkpoint(Path(case["checkpoint"]), workdir / case["name"])
        policy = real_worker.policy_config(tree, checkpoint, case["overrides"])
        runtime = real_worker.configure(worker, policy, checkpoint)
        megatron_worker._after_model_built(build_on_cpu(runtime.model_cfg)[0])  # NeMo-RL's model[0]


def main(tree: str, spec: str) -> None:
    sys.path.append(tree)
    from nemo_rl_attn_align.probe.bridge_side import import_bridge
    from nemo_rl_attn_align.probe.megatron_side import ensure_model_parallel

    import_bridge()  # megatron-core first (its own attention, not the stand-in's), then TE's stand-in
    import attn_align_stand_ins  # noqa: F401 - the names megatron-core 0.19.2 lacks

    ensure_model_parallel()
    spec_ = json.loads(spec)
    cases = spec_["cases"]
    workdir = Path(spec_["out"]).parent / "training-checkpoints"
    errors: dict[str, str | None] = {}
    for case in cases:
        try:
            run_case(Path(tree), case, workdir)
            errors[case["name"]] = None
        except Exception:
            errors[case["name"]] = traceback.format_exc()[-3000:]
    Path(spec_["out"]).write_text(json.dumps(errors))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
