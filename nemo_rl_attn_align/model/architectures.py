"""The architecture table: how each host reads a ``config.json``, generated from the hosts, not written.

``tables/architectures.json`` holds, per side and per architecture (``architectures[0]`` of the
config, which both hosts dispatch on), the rules ``scripts/update_architecture_table.py`` inferred
from what the host answered over sampled configs: ``training`` from Megatron-Bridge's conversion
(the provider's attention attributes, and where the provider builds its own core-attention module,
each layer's window, scale and soft cap as that module holds them), ``rollout`` from vLLM's model
code (every layer's attention module). Each side names the host versions it came from. ``training_attributes`` and
``rollout_layers`` apply them to a user's config; an architecture the table lacks, a rule that reads
a key the config does not have, or an answer the generator could not explain gives ``NotRead``
with the reason, never a guess. Stdlib only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.model.architecture_rules import ABSENT, MISSING, evaluate, keys, layer_kind
from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.limits import MAX_MODEL_LAYERS, integer_problem, shown

TABLE = Path(__file__).with_name("tables") / "architectures.json"
SCHEMA = 1
SIDES = ("training", "rollout")


@dataclass(frozen=True)
class NotRead:
    """Why one side's reading of a config is not known (the architecture, a key, the generator's failure)."""

    why: str


@dataclass(frozen=True)
class TableSource:
    """Where a reading came from: the host and versions the table was generated with, and the entry."""

    host: str
    versions: Mapping[str, str]
    architecture: str

    @property
    def label(self) -> str:
        versions = ", ".join(f"{name} {v}" for name, v in sorted(self.versions.items()))
        return f"{self.host}'s reading of {self.architecture}, from the architecture table generated with {versions}"


def load_raw(path: Path = TABLE) -> dict[str, Any]:
    """The table as written (an empty one of this schema when the file is missing)."""
    try:
        data = jsonio.loads(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError):
        return {"schema": SCHEMA}
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else {"schema": SCHEMA}


def write_raw(table: Mapping[str, Any], path: Path = TABLE) -> None:
    """Write the table reproducibly (sorted keys, one item per line)."""
    path.write_text(jsonio.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")


@functools.cache
def load() -> dict[str, Any]:
    """The committed table, read once per process."""
    return load_raw()


def entry(side: str, architecture: str) -> tuple[dict[str, Any], TableSource] | NotRead:
    """The table's entry for ``architecture`` on ``side``, or why there is none."""
    half = load().get(side)
    if not isinstance(half, dict):
        return NotRead(f"the architecture table has no {side} side")
    host = half.get("host", side)
    found = half.get("architectures", {}).get(architecture)
    if found is None:
        known = len(half.get("architectures", {}))
        return NotRead(f"{host}'s reading of {architecture} is not in the architecture table ({known} architectures)")
    if "error" in found:
        return NotRead(f"{host} could not read transformers' own {found.get('model_type')} config: {found['error']}")
    return found, TableSource(host, dict(half.get("versions", {})), architecture)


def _value(rule_entry: Mapping[str, Any], config: Mapping[str, Any], what: str) -> Any:
    """One rule's value for ``config``; ``NotRead`` when it needs a key the config lacks or has no rule."""
    if "not_understood" in rule_entry:
        return NotRead(f"{what}: the generator found no rule ({rule_entry['not_understood']})")
    value = evaluate(rule_entry["rule"], config)
    if value is MISSING:
        return NotRead(f"{what} needs {', '.join(keys(rule_entry['rule'])) or 'a value'}, which the config lacks")
    return value


def training_attributes(architecture: str, config: Mapping[str, Any]) -> tuple[dict[str, Any], TableSource] | NotRead:
    """The attention attributes of Megatron-Bridge's provider for ``config`` (the table's rules), with the
    provider's own attention fields under ``own_fields`` and, where the provider builds its own
    core-attention module, each layer's facts of it under ``layers``; or why they are not known."""
    found = entry("training", architecture)
    if isinstance(found, NotRead):
        return found
    table, source = found
    values: dict[str, Any] = {}
    for name, rule_entry in sorted(table["attributes"].items()):
        value = _value(rule_entry, config, f"{table['provider']}.{name}")
        if isinstance(value, NotRead):
            return value
        if value != ABSENT:
            values[name] = value
    reading = {"provider": table["provider"], "attributes": values, "own_fields": table.get("own_fields", [])}
    if "layers" in table:
        layers = _layers(table["layers"], values.get("num_layers"), config, f"{source.host}'s {table['provider']}")
        if isinstance(layers, NotRead):
            return layers
        reading["layers"] = layers
    return reading, source


def rollout_layers(architecture: str, config: Mapping[str, Any]) -> tuple[dict[str, Any], TableSource] | NotRead:
    """vLLM's model for ``config`` (the table's rules): its class and each layer's attention facts
    (None: no attention module there); or why they are not known."""
    found = entry("rollout", architecture)
    if isinstance(found, NotRead):
        return found
    table, source = found
    count = _value(table["num_layers"], config, "the number of layers")
    if isinstance(count, NotRead):
        return count
    layers = _layers(table["layers"], count, config, f"{source.host}'s layers of {architecture}")
    if isinstance(layers, NotRead):
        return layers
    return {"model_class": table["model_class"], "num_layers": count, "layers": layers}, source


def _layers(
    layers_entry: Mapping[str, Any], count: Any, config: Mapping[str, Any], what: str
) -> list[dict[str, Any] | None] | NotRead:
    """Each of ``count`` layers' facts by a table's per-layer rules (None: not an attention layer there)."""
    if "not_understood" in layers_entry:
        return NotRead(f"{what}: {layers_entry['not_understood']}")
    if (why := integer_problem(count, MAX_MODEL_LAYERS)) is not None:
        return NotRead(f"the number of layers {shown(count)} {why} (README: Limits on input)")
    layers: list[dict[str, Any] | None] = []
    for index in range(count):
        kind = layer_kind(layers_entry["partition"], config, index)
        if kind is None or kind not in layers_entry["kinds"]:
            where = layers_entry["partition"].get("key", "its layer index")
            return NotRead(f"layer {index}'s kind ({where}: {kind!r}) was never seen when the table was generated")
        rules = layers_entry["kinds"][kind]
        if rules is None:
            layers.append(None)
            continue
        facts = {}
        for name, rule in rules.items():
            value = _value({"rule": rule}, config, f"layer {index}'s {name}")
            if isinstance(value, NotRead):
                return value
            facts[name] = value
        layers.append(facts)
    return layers
