"""The model of a recipe, read once: ``ModelFacts``, its attention as each host will build it.

``read_model_facts`` finds ``policy.model_name``'s ``config.json`` on this machine
(``model_config``), applies what each side overrides in it (training:
``policy.hf_config_overrides``, which NeMo-RL passes to ``AutoConfig.from_pretrained``; rollout:
``vllm_kwargs.hf_overrides``), and reads each side's attention by the architecture table, the
hosts' own readings generated over every architecture NeMo-RL's recipes train (``architectures``).
Megatron's ``model_overrides`` then replace provider attributes, as NeMo-RL merges them before it
builds the model. Inside ``hosts_read_here()`` (what ``check`` runs in), an architecture the table
lacks is read by the host itself where it is installed (``hosts.model_readers`` in a subprocess,
once per config and process; the source says so); elsewhere (a training run's driver and workers,
which must not start a host) and where no host is installed the side is ``NotRead`` with the
reason, never a guess. The rules, ``check --gpu``, the binding preview, ``drift`` and the
in-run estimate read only this. Stdlib only.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_attn_align.config.config_lookup import UNSET
from nemo_rl_attn_align.model import architectures
from nemo_rl_attn_align.model.architectures import NotRead
from nemo_rl_attn_align.model.model_attention import MEGATRON_ATTRIBUTES, HostModel, megatron_model, vllm_model
from nemo_rl_attn_align.model.model_config import (
    ConfigNotRead,
    HFModelConfig,
    config_problems,
    load_model_config,
    not_found_line,
)
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import shown

#: Host fields of a provider the plugin does not read whose names say they change attention per layer.
PER_LAYER_OWN_FIELDS = ("window", "attn_pattern", "sink", "softmax")
#: Where each side's overrides of the model's config.json are set in a recipe.
TRAINING_OVERRIDES = "policy.hf_config_overrides"
ROLLOUT_OVERRIDES = "policy.generation.vllm_kwargs.hf_overrides"
#: Where Megatron's ``TransformerConfig`` attributes are overridden in a recipe.
MODEL_OVERRIDES = "policy.megatron_cfg.model_overrides"
#: The provider attributes an own attention module (Gemma 2's, Gemma 3's) lays its layers out from,
#: which a ``model_overrides`` entry would change where the table's per-layer rules cannot follow.
OWN_MODULE_READS = ("window_size", "window_attn_skip_freq", "softmax_scale")
#: How long a host reading run here may take (vLLM imports for tens of seconds on 2 cores).
LIVE_TIMEOUT_S = 300
_HOSTS = {"training": ("megatron", "megatron.bridge", "Megatron-Bridge"), "rollout": ("vllm", "vllm", "vLLM")}
_READ_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("attn_align_hosts_read_here", default=False)


@contextlib.contextmanager
def hosts_read_here() -> Iterator[None]:
    """Inside: an architecture the table lacks is read by the host itself, where it is installed."""
    token = _READ_HERE.set(True)
    try:
        yield
    finally:
        _READ_HERE.reset(token)


@dataclass(frozen=True)
class ModelFacts:
    """The model's attention on both sides (a side that is not known says why), and its config."""

    config: HFModelConfig | None = None
    #: Without a config: where it was looked for and the command that fetches it.
    not_found: str | None = None
    training: HostModel | NotRead = NotRead("no config.json was read")
    rollout: HostModel | NotRead = NotRead("no config.json was read")
    #: Model overrides applied to the training side, by key.
    applied: Mapping[str, Any] = field(default_factory=dict)
    #: A config.json that is there but cannot be used (unreadable, not JSON, a value over a limit),
    #: or a recipe override of the model's values over a limit, in one line: ``check`` and ``drift``
    #: stop on it (exit 2), a run's driver notes it and goes on.
    unusable: str | None = None

    @property
    def unread(self) -> str | None:
        """Why no config.json was read (not on this machine, or not usable), in one line; None when one was."""
        return self.not_found or self.unusable

    @property
    def architecture(self) -> str | None:
        architectures_ = self.config.config.get("architectures") if self.config else None
        return architectures_[0] if isinstance(architectures_, list) and architectures_ else None

    def side(self, name: str) -> HostModel | NotRead:
        return self.training if name == "training" else self.rollout

    def to_dict(self) -> dict[str, Any]:
        def side(value: HostModel | NotRead) -> dict[str, Any]:
            return value.to_dict() if isinstance(value, HostModel) else {"not_read": value.why}

        return {
            "config": str(self.config.path) if self.config else None,
            "architecture": self.architecture,
            "not_found": self.not_found,
            **({"unusable": self.unusable} if self.unusable else {}),
            "training": side(self.training),
            "rollout": side(self.rollout),
        }


def _overridden(config: Mapping[str, Any], overrides: Any) -> dict[str, Any]:
    """``config`` with ``overrides`` (a mapping) set on its top level, as ``from_pretrained(**kwargs)``
    and vLLM's ``hf_overrides`` set them."""
    return {**config, **overrides} if isinstance(overrides, Mapping) else dict(config)


def _refusal(values: Any, key: str) -> NotRead | None:
    """``NotRead`` naming the first of ``values`` (a mapping at recipe key ``key``, set on the model's
    config) that breaks a limit of a model's values (``model_config.config_problems``), else None."""
    problem = next(config_problems(values, f"{key}."), None) if isinstance(values, Mapping) else None
    if problem is None:
        return None
    name, value, why = problem
    return NotRead(f"{name}={shown(value)} {why} (README: Limits on input). Fix: correct {name} in the recipe")


def _live(side: str, config: Mapping[str, Any]) -> dict[str, Any] | NotRead:
    """The host's own reading of ``config`` inside ``hosts_read_here()``, where the host is installed."""
    if not _READ_HERE.get():
        return NotRead(f"{_HOSTS[side][2]} is not run by this reader (check runs it where it is installed)")
    return _read_by_host(side, jsonio.dumps(config, sort_keys=True))


@functools.cache
def _read_by_host(side: str, config_json: str) -> dict[str, Any] | NotRead:
    """The host's own reading of one config, in a subprocess (once per config and process)."""
    import importlib.util
    import os
    import subprocess
    import sys
    import tempfile

    host, module, name = _HOSTS[side]
    config = jsonio.loads(config_json, "config.json")
    if importlib.util.find_spec(module.split(".")[0]) is None or (
        "." in module and importlib.util.find_spec(module) is None
    ):
        return NotRead(f"{name} is not installed here to read it")
    with tempfile.TemporaryDirectory(prefix="attn-align-model-") as tmp:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as handle:
            handle.write(jsonio.dumps(config))
        out = os.path.join(tmp, "out.json")
        env = {**os.environ, "NEMO_RL_ATTN_ALIGN": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "nemo_rl_attn_align.hosts.model_readers", host, out, tmp],
                env=env,
                capture_output=True,
                text=True,
                timeout=LIVE_TIMEOUT_S,
            )
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
                return NotRead(f"{name}'s reader failed here: {tail}")
            with open(out, encoding="utf-8") as handle:
                answer = jsonio.loads(handle.read(), f"{name}'s answer")[0]
        except (OSError, ValueError, subprocess.TimeoutExpired) as err:
            return NotRead(f"{name}'s reader did not finish here ({type(err).__name__})")
    return NotRead(f"{name} could not read it here: {answer['error']}") if "error" in answer else answer


def _training(config: Mapping[str, Any], architecture: str, applied: Mapping[str, Any]) -> HostModel | NotRead:
    """Megatron's layers: the table's (else the host's own) provider attributes, the ``model_overrides``
    that apply to them (``applied``) on top."""
    found = architectures.training_attributes(architecture, config)
    if isinstance(found, NotRead):
        live = _live("training", config)
        if isinstance(live, NotRead):
            return NotRead(f"{found.why}; {live.why}")
        reading, source = live, "Megatron-Bridge run here (the architecture table lacks it)"
    else:
        reading, source = found[0], found[1].label
    attributes = {**reading["attributes"], **applied}
    own_layers = reading.get("layers")
    own = [name for name in reading.get("own_fields", []) if any(word in name for word in PER_LAYER_OWN_FIELDS)]
    if own and own_layers is None:
        return NotRead(
            f"{reading['provider']} builds its layers with its own {', '.join(own)}, which the plugin does not read"
        )
    moved = sorted(set(applied) & set(OWN_MODULE_READS)) if own_layers is not None else []
    if moved:
        return NotRead(
            f"{MODEL_OVERRIDES}.{moved[0]}: {reading['provider']}'s own attention module lays out each layer's "
            "window and scale, which the plugin reads from config.json only"
        )
    source = f"{source} ({reading['provider']}{'; its own attention modules' if own_layers is not None else ''})"
    model = megatron_model(attributes, "Megatron-Bridge", source, own_layers)
    return NotRead(f"{reading['provider']}: {model}") if isinstance(model, str) else model


def _rollout(config: Mapping[str, Any], architecture: str) -> HostModel | NotRead:
    """vLLM's layers: the table's (else the host's own) reading of each layer's attention module."""
    found = architectures.rollout_layers(architecture, config)
    if isinstance(found, NotRead):
        live = _live("rollout", config)
        if isinstance(live, NotRead):
            return NotRead(f"{found.why}; {live.why}")
        reading, source = live, "vLLM run here (the architecture table lacks it)"
    else:
        reading, source = found[0], found[1].label
    model = vllm_model(reading["layers"], "vLLM", f"{source} ({reading.get('model_class') or reading['architecture']})")
    return NotRead(model) if isinstance(model, str) else model


def read_model_facts(
    model_name: Any,
    config: HFModelConfig | ConfigNotRead | Any | None = UNSET,
    *,
    training_overrides: Any = None,
    rollout_overrides: Any = None,
    model_overrides: Mapping[str, Any] | None = None,
) -> ModelFacts:
    """The attention both sides build for ``policy.model_name``: its config.json on this machine (the
    Hugging Face cache this process's environment names; ``config``, when already read) and the overrides."""
    model = load_model_config(model_name) if config is UNSET else config
    if model is None:
        model = ConfigNotRead(not_found_line(model_name), missing=True)
    if isinstance(model, ConfigNotRead):
        missing, unusable = (model.line, None) if model.missing else (None, model.line)
        return ModelFacts(None, missing, NotRead(model.line), NotRead(model.line), unusable=unusable)
    arch = model.config.get("architectures")
    architecture = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
    if architecture is None:
        why = f"{model.path} names no architectures[0], which both hosts dispatch on"
        return ModelFacts(model, None, NotRead(why), NotRead(why))
    applied = {k: v for k, v in (model_overrides or {}).items() if k in MEGATRON_ATTRIBUTES}
    training_refused = _refusal(training_overrides, TRAINING_OVERRIDES) or _refusal(applied, MODEL_OVERRIDES)
    rollout_refused = _refusal(rollout_overrides, ROLLOUT_OVERRIDES)
    refused = training_refused or rollout_refused
    return ModelFacts(
        model,
        None,
        training_refused or _training(_overridden(model.config, training_overrides), architecture, applied),
        rollout_refused or _rollout(_overridden(model.config, rollout_overrides), architecture),
        applied,
        unusable=refused.why if refused else None,
    )
