"""One side of a probe: what it runs (``SideSpec``, read from a JSON file) and its process.

A side file is a JSON object: ``engine`` (``"megatron"``: megatron-core's GPTModel,
``megatron_side.py``; ``"megatron-bridge"``: the GPTModel NeMo-RL builds from an HF checkpoint
through Megatron-Bridge, ``bridge_side.py``; ``"vllm"``: a vLLM engine, ``vllm_side.py``),
``model`` (the model's settings: ``TransformerConfig`` fields and GPTModel arguments; the
``checkpoint``, ``precision``, ``hf_config_overrides`` and provider fields; or vLLM's ``LLM(...)`` arguments),
``seed`` (the weights' seed: two sides with one seed hold the same weights), ``python`` (the
interpreter of the side's venv, default this one), ``name`` (default the file's stem),
``replay`` (the reference materializer that replays its attention for the estimate, ``replay.py``;
default by engine) and ``env`` (environment variables of its process). Each side runs in its own
process and writes a capture file; the driver never imports the engines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.preflight.facts import PRECISIONS
from nemo_rl_attn_align.probe import capture as capture_file
from nemo_rl_attn_align.probe.replay import DEFAULT_REPLAYS, check_name
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.errors import UsageError
from nemo_rl_attn_align.vocab.exit_codes import EXIT_OK, EXIT_UNUSABLE

#: engine -> the module that captures it (``python -m MODULE SIDE_JSON OUT [REFERENCE]``).
ENGINES = {
    "megatron": "nemo_rl_attn_align.probe.megatron_side",
    "megatron-bridge": "nemo_rl_attn_align.probe.bridge_side",
    "vllm": "nemo_rl_attn_align.probe.vllm_side",
}
KEYS = ("engine", "model", "seed", "python", "name", "replay", "env")
#: The batch when no --prompts is given: two sequences of distinct lengths.
DEFAULT_SEQUENCES = [[5, 17, 42, 99, 123, 7, 64, 3], [11, 2, 90, 33, 8]]


@dataclass(frozen=True)
class SideSpec:
    """What one side runs, and the batch it runs."""

    name: str
    engine: str = "megatron"
    model: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    python: str = sys.executable
    sequences: list[list[int]] = field(default_factory=lambda: [list(s) for s in DEFAULT_SEQUENCES])
    replay: str | None = None
    #: environment variables of the side's process (a NeMo-RL worker's ``env_vars``)
    env: dict[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """What the capture records of how it was made."""
        replay = self.replay or DEFAULT_REPLAYS.get(self.engine)
        return {"engine": self.engine, "model": self.model, "seed": self.seed, "replay": replay, "env": self.env}

    def to_json(self) -> str:
        return jsonio.dumps(self.__dict__)

    @classmethod
    def read(cls, path: Path) -> SideSpec:
        """A side file (or the JSON ``to_json`` wrote); bad content is a one-line ``UsageError``."""
        try:
            raw = jsonio.loads(path.read_text(), f"side file {path}")
        except (OSError, ValueError) as err:  # unreadable, not UTF-8, not (strict) JSON
            raise UsageError(
                f"{path}: cannot read the side file ({err}); give a JSON object of {', '.join(KEYS)}"
            ) from None
        if not isinstance(raw, dict):
            raise UsageError(f"{path}: a side file is a JSON object, found {type(raw).__name__}")
        unknown = sorted(set(raw) - set(KEYS) - {"sequences"})
        if unknown:
            raise UsageError(f"{path}: key {unknown[0]!r} is not a side setting; the keys are {', '.join(KEYS)}")
        engine = raw.get("engine", "megatron")
        if engine not in ENGINES:
            raise UsageError(f"{path}: engine={engine!r} cannot be probed yet; use one of {', '.join(ENGINES)}")
        if not isinstance(raw.get("model", {}), dict):
            raise UsageError(f"{path}: model={raw['model']!r} is not an object; give the model's settings by name")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise UsageError(
                f'{path}: env={env!r} is not an object of strings; e.g. "env": {{"VLLM_BATCH_INVARIANT": "1"}}'
            )
        if raw.get("replay") is not None:
            check_name(str(raw["replay"]), str(path))
        if engine == "megatron-bridge":
            _check_checkpoint_model(raw.get("model", {}), str(path))
        return cls(**{"name": path.stem, **raw})


def _check_checkpoint_model(model: dict[str, Any], where: str) -> None:
    """A megatron-bridge side's ``model`` before any process starts: ``checkpoint`` is an HF checkpoint
    directory (holding ``config.json``) or a hub id (``org/name``, read from the Hugging Face cache as
    NeMo-RL reads ``policy.model_name``); ``precision`` is one NeMo-RL takes."""
    checkpoint = model.get("checkpoint")
    local = isinstance(checkpoint, str) and Path(checkpoint).exists()
    hub_id = isinstance(checkpoint, str) and not local and checkpoint.count("/") == 1 and " " not in checkpoint
    if not hub_id and not (local and (Path(str(checkpoint)) / "config.json").is_file()):
        raise UsageError(
            f"{where}: model.checkpoint={checkpoint!r} is not a Hugging Face checkpoint directory (no config.json) "
            "or hub id; give what NeMo-RL's policy.model_name names"
        )
    if model.get("precision", "float32") not in PRECISIONS:
        raise UsageError(
            f"{where}: model.precision={model['precision']!r}: use one of {', '.join(PRECISIONS)} "
            "(NeMo-RL's policy.precision)"
        )
    if not isinstance(model.get("hf_config_overrides", {}), dict):
        raise UsageError(
            f"{where}: model.hf_config_overrides={model['hf_config_overrides']!r} is not an object; give the "
            'Hugging Face config keys to set, e.g. {"rope_theta": 500000.0} (NeMo-RL\'s policy.hf_config_overrides)'
        )


def read_prompts(path: Path) -> list[list[int]]:
    """``--prompts``: a JSON list of token-id lists, each at least two tokens long."""
    try:
        raw = jsonio.loads(path.read_text(), f"--prompts {path}")
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not (strict) JSON
        raise UsageError(f"--prompts {path}: cannot read it ({err}); give a JSON list of token-id lists") from None
    ok = (
        isinstance(raw, list)
        and raw
        and all(isinstance(s, list) and len(s) >= 2 and all(isinstance(t, int) and t >= 0 for t in s) for s in raw)
    )
    if not ok:
        raise UsageError(
            f"--prompts {path}: expected a JSON list of token-id lists of 2 or more ids, e.g. [[5, 17, 42]]"
        )
    return raw


def run(spec: SideSpec, workdir: Path, reference: Path | None = None) -> Path:
    """Run ``spec``'s side in its own process (``spec.python``); the path of the capture it wrote."""
    side_file, out = workdir / f"{spec.name}.side.json", workdir / f"{spec.name}.capture.pt"
    side_file.write_text(spec.to_json())
    command = [spec.python, "-m", ENGINES[spec.engine], str(side_file), str(out)]
    command += [str(reference)] if reference is not None else []
    done = subprocess.run(command, capture_output=True, text=True, env=environment(spec, workdir))
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UsageError(f"side {spec.name} ({spec.python}) failed with exit {done.returncode}: {last}")
    return out


def preflight(specs: list[SideSpec], workdir: Path) -> None:
    """Before any side starts: each side's interpreter finds every module its engine imports, else one
    ``UsageError`` naming the side, the missing modules and the pip command that installs them."""
    from nemo_rl_attn_align.probe.envs import missing

    for spec in specs:
        lacking = missing(spec.engine, spec.python, environment(spec, workdir))
        if lacking is not None:
            raise UsageError(
                f"side {spec.name} ({spec.python}) cannot run engine {spec.engine}: {lacking} "
                "(or build both sides' venvs: nemo-rl-attn-align probe --make-envs DIR)"
            )


def environment(spec: SideSpec, workdir: Path) -> dict[str, str]:
    """The side's process environment: this one, the side's ``env``, and this plugin first on its path,
    alone: a folder in ``workdir`` holding a link to the package (the folder that holds the package
    is a site-packages for an installed plugin, whose other packages are not the side venv's)."""
    plugin = workdir / "plugin"
    link = plugin / PACKAGE.name
    plugin.mkdir(exist_ok=True)
    if link.is_symlink():  # a kept --out folder: link this plugin, whichever it linked before
        link.unlink()
    link.symlink_to(PACKAGE, target_is_directory=True)
    path = os.pathsep.join(p for p in (str(plugin), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **spec.env, "PYTHONPATH": path}


#: This plugin's package folder.
PACKAGE = Path(__file__).resolve().parents[1]


def side_main(capture: Callable[[SideSpec, capture_file.Capture | None], capture_file.Capture], argv: list[str]) -> int:
    """A side's process: ``SIDE_JSON OUT [REFERENCE]``, the capture of ``capture`` written to OUT."""
    try:
        reference = capture_file.load(Path(argv[2])) if len(argv) > 2 else None
        capture_file.save(capture(SideSpec.read(Path(argv[0])), reference), Path(argv[1]))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    return EXIT_OK
