"""The real NeMo-RL Megatron worker path, driven without Ray.

Used by the GPU suite where NeMo-RL is installed (``nemo_rl_host.locate``) and, for the steps that
run on CPU, by the real-NeMo-RL lane (``tests/real_nemo_rl``). ``MegatronPolicyWorker.__init__``
(read at 7ea279a, v0.7.0, v0.6.0) runs, in order: ``setup_distributed()``,
``validate_and_set_config(config, rank, hf_model_name, pretrained_path, weights_path,
optimizer_path)`` (-> ``setup_model_config`` -> ``_apply_performance_config``) and
``setup_model_and_optimizer(config, megatron_cfg, init_optimizer, ...)``. ``configure`` and
``build`` call them through the worker module's own names, which the plugin wraps.

In place of NeMo-RL's one-time HF -> Megatron import (``handle_model_import``), ``write_checkpoint``
writes what that import leaves for a tiny model: its HF ``config.json`` and tokenizer, and
``iter_0000000/run_config.yaml``, written by Megatron-Bridge's ``ConfigContainer.to_yaml`` from the
provider its ``AutoBridge`` makes of that config. No weights: the model is built with random ones.
The policy config is the NeMo-RL tree's own ``examples/configs/grpo_math_1B_megatron.yaml``, read
with its own ``nemo_rl.utils.config``, with the case's keys as Hydra overrides.
torch, transformers, Megatron and NeMo-RL are imported inside the functions only.
"""

from __future__ import annotations

import inspect
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"
RECIPE = Path("examples") / "configs" / "grpo_math_1B_megatron.yaml"
#: Megatron (TransformerConfig) name -> Hugging Face Llama config name, for the tiny model.
HF_NAMES = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "vocab_size": "vocab_size",
    "seq_length": "max_position_embeddings",
    "rotary_base": "rope_theta",
}


def nemo_rl_tree() -> Path:
    """The source tree of the imported ``nemo_rl``; it must hold the recipe the policy comes from."""
    import nemo_rl

    tree = Path(nemo_rl.__file__).resolve().parents[1]
    if not (tree / RECIPE).is_file():
        raise FileNotFoundError(
            f"{tree / RECIPE} not found: the real worker path reads its policy config from the "
            "NeMo-RL checkout nemo_rl is imported from. Fix: run from a NeMo-RL source checkout "
            "(pip install -e), as NeMo-RL's container has it"
        )
    return tree


def _tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level Hugging Face tokenizer of ``vocab_size`` tokens, saved in ``directory``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t3"
    ).save_pretrained(directory)


def write_checkpoint(directory: Path, model: Mapping[str, Any]) -> Path:
    """A tiny Llama as NeMo-RL's HF import leaves it in ``directory`` (returned); ``model`` uses
    Megatron's names (``HF_NAMES`` go into ``config.json``, the rest, such as ``attention_dropout``
    or ``deterministic_mode``, onto the provider; ``transformer_impl: local`` picks the local spec)."""
    from transformers import LlamaConfig

    directory.mkdir(parents=True, exist_ok=True)
    hf = LlamaConfig(**{HF_NAMES[k]: v for k, v in model.items() if k in HF_NAMES}, architectures=["LlamaForCausalLM"])
    hf.save_pretrained(directory)
    _tokenizer(directory, hf.vocab_size)
    return write_run_config(directory, hf, {k: v for k, v in model.items() if k not in HF_NAMES})


def write_run_config(directory: Path, hf: Any, provider_fields: Mapping[str, Any] | None = None) -> Path:
    """``directory/iter_0000000/run_config.yaml`` as NeMo-RL's HF import writes it for the model of
    Hugging Face config ``hf``: the provider the installed Megatron-Bridge makes of it, with
    ``provider_fields`` set on it (``transformer_impl: local`` picks the local spec); ``directory``."""
    from megatron.bridge import AutoBridge
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        LoggerConfig,
        OptimizerConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
    )

    provider_fields = provider_fields or {}
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    for key, value in provider_fields.items():
        setattr(provider, key, value)
    if provider_fields.get("transformer_impl") == "local":
        provider.transformer_layer_spec = local_layer_spec
    container = ConfigContainer(
        model=provider,
        train=TrainingConfig(micro_batch_size=1, global_batch_size=1, train_iters=1),
        optimizer=OptimizerConfig(),
        scheduler=SchedulerConfig(),
        dataset=None,
        logger=LoggerConfig(),
        tokenizer=TokenizerConfig(),
        checkpoint=CheckpointConfig(),
    )
    (directory / "iter_0000000").mkdir(exist_ok=True)
    container.to_yaml(str(directory / "iter_0000000" / "run_config.yaml"))
    return directory


def register_resolvers() -> None:
    """The OmegaConf resolvers NeMo-RL's recipe scripts register: its own function where it has one
    (>= 0.6), else ``mul``, as ``examples/run_grpo.py`` registers it at v0.5.0."""
    from nemo_rl.utils import config
    from omegaconf import OmegaConf

    register = getattr(config, "register_omegaconf_resolvers", None)
    if register is not None:
        register()
    elif not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda a, b: a * b)


def policy_config(tree: Path, checkpoint: Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The resolved ``policy`` of ``tree``'s recipe for ``checkpoint``, with ``overrides`` (Hydra)
    and ``megatron_cfg.train_iters`` (which the algorithm's ``setup()`` sets before the workers start)."""
    from nemo_rl.utils.config import load_config, parse_hydra_overrides
    from omegaconf import OmegaConf

    register_resolvers()
    base = [
        f"policy.model_name='{checkpoint}'",
        f"policy.tokenizer.name='{checkpoint}'",
        "++policy.megatron_cfg.train_iters=1",
    ]
    cfg = parse_hydra_overrides(load_config(str(tree / RECIPE)), [*base, *overrides])
    return OmegaConf.to_container(cfg, resolve=True)["policy"]


def case_overrides(policy: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that give the recipe's policy the keys of a GPU case (``cases.policy_config``)."""
    megatron = policy["megatron_cfg"]
    keys = {
        f"megatron_cfg.{k}": megatron[k]
        for k in (
            "attention_backend",
            "transformer_impl",
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "sequence_parallel",
            "apply_rope_fusion",
        )
        if k in megatron
    }
    keys.update({k: policy[k] for k in ("precision", "train_micro_batch_size", "logprob_batch_size") if k in policy})
    out = [f"++policy.{key}={'true' if v is True else 'false' if v is False else v}" for key, v in keys.items()]
    tokenizer = (policy.get("tokenizer") or {}).get("name")
    if tokenizer and Path(tokenizer).is_dir():  # a real tokenizer on disk (the vLLM binding case): both sides use it
        out.append(f"policy.tokenizer.name='{tokenizer}'")
    return out


def configure(worker: Any, policy: dict[str, Any], checkpoint: Path, rank: int = 0) -> Any:
    """``worker.validate_and_set_config`` as the worker calls it (checkpoint = HF name = pretrained path).
    NeMo-RL 0.5.x builds the model config inside ``MegatronPolicyWorker.__init__``: not driven here."""
    if not hasattr(worker, "validate_and_set_config"):
        raise NotImplementedError(
            f"{worker.__name__} has no validate_and_set_config (NeMo-RL 0.5.x builds the model "
            "config inside MegatronPolicyWorker.__init__); the real worker path is driven for "
            "NeMo-RL >= 0.6 only. Fix: run the GPU suite with NeMo-RL >= 0.6"
        )
    return worker.validate_and_set_config(policy, rank, str(checkpoint), str(checkpoint), None, None)


def setup_distributed(worker: Any) -> None:
    """NeMo-RL's ``setup_distributed()`` (an NCCL group) for a world of one on GPU 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        os.environ.setdefault(key, value)
    worker.setup_distributed()


def build(worker: Any, policy: dict[str, Any], runtime: Any) -> Any:
    """``worker.setup_model_and_optimizer`` without optimizer or weights; the built model."""
    kwargs = {"load_optimizer": False}
    if "load_weights" in inspect.signature(worker.setup_model_and_optimizer).parameters:
        kwargs["load_weights"] = False
    return worker.setup_model_and_optimizer(policy, runtime.megatron_cfg, **kwargs).model
