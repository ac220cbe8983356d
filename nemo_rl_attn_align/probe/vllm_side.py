"""The rollout side: a vLLM engine's prefill over the batch, captured by forward hooks on its model.

``python -m nemo_rl_attn_align.probe.vllm_side SIDE_JSON OUT [REFERENCE]``. ``model`` in the side
file is the engine's ``LLM(...)`` arguments (``model``: the checkpoint directory); the engine runs
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, without prefix caching, one sequence
per ``generate`` with ``max_tokens=1`` and ``prompt_logprobs=0`` (one prefill forward). With a
reference, each sequence runs a second time with every layer's QKV output and attention inputs
replaced by the reference's (a forward hook and a forward pre-hook returning them): the query and
key reaching attention there are vLLM's RoPE on the reference's QKV output (RoPE's share), and its
attention outputs are vLLM's attention on the reference's query/key/value (attention's share).
Off a GPU, vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT``, which ``preset: aligned`` sets) is
turned off and the capture names that (``settings["substitutions"]``): its kernels are Triton GPU
kernels. The model's layers are read as vLLM's Llama-family decoder layers (``self_attn.qkv_proj``,
``self_attn.attn``, ``post_attention_layernorm`` with the fused residual add).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.probe import capture as capture_file
from nemo_rl_attn_align.probe.sides import SideSpec, side_main

#: Off a GPU, what the capture names when vLLM's batch-invariant mode was on.
NO_BATCH_INVARIANCE = "VLLM_BATCH_INVARIANT off (its kernels are Triton GPU kernels)"
#: What the probe sets over the side's ``model``: hooks need eager modules, a replay needs no cached prefix.
ENGINE_DEFAULTS = {"enforce_eager": True, "enable_prefix_caching": False, "skip_tokenizer_init": True, "seed": 0}


class _Hooks:
    """Hooks on every decoder layer; ``substitute`` (per layer: qkv, query, key, value) turns on the replay."""

    def __init__(self, model: Any):
        self.layers_modules = list(model.model.layers)
        self.layers: list[dict[str, Any]] = [{} for _ in self.layers_modules]
        self.substitute: list[tuple[Any, Any, Any, Any]] | None = None
        for i, layer in enumerate(self.layers_modules):
            attn = layer.self_attn
            attn.qkv_proj.register_forward_hook(self._keep(i, "qkv", lambda args, out: out[0]))
            attn.qkv_proj.register_forward_hook(self._swap_qkv(i))
            attn.attn.register_forward_pre_hook(self._inputs(i))
            attn.attn.register_forward_hook(self._keep(i, "attention", lambda args, out: out))
            layer.post_attention_layernorm.register_forward_pre_hook(self._residual(i))
            layer.register_forward_hook(self._keep(i, "after_mlp", lambda args, out: out[0] + out[1]))

    def _keep(self, index: int, name: str, pick):
        def keep(_module, args, out):
            self.layers[index][name] = pick(args, out).detach().float().clone()

        return keep

    def _residual(self, index: int):
        def keep(_module, args):
            self.layers[index]["after_attention"] = (args[0].float() + args[1].float()).detach().clone()

        return keep

    def _swap_qkv(self, index: int):
        def swap(_module, _args, out):
            if self.substitute is None:
                return None
            return (self.substitute[index][0].to(out[0].dtype), *out[1:])

        return swap

    def _inputs(self, index: int):
        def keep(module, args):
            query, key, value = args[:3]
            tokens = query.shape[0]
            shaped = [t.reshape(tokens, -1, module.head_size) for t in (query, key, value)]
            if self.substitute is None:
                kept = (t.detach().float().clone() for t in shaped)
                self.layers[index].update(zip(("query", "key", "value"), kept, strict=True))
                return None
            rotated = (t.detach().float().clone() for t in shaped[:2])
            self.layers[index]["rope"] = dict(zip(("query", "key"), rotated, strict=True))
            replaced = [t.to(query.dtype).reshape(tokens, -1) for t in self.substitute[index][1:]]
            return (*replaced, *args[3:])

        return keep


def _logprobs(output: Any, ids: list[int]) -> list[float]:
    """Each prompt token's log-probability given the tokens before it (the first has none)."""
    return [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], ids[1:], strict=True)]


def cpu_substitutions() -> list[str]:
    """Off a GPU, before vLLM is imported: its batch-invariant mode turned off in this process (its
    kernels are Triton GPU kernels); the names of what was changed."""
    import torch

    if not torch.cuda.is_available() and vllm_batch_invariant(os.environ):
        del os.environ["VLLM_BATCH_INVARIANT"]
        return [NO_BATCH_INVARIANCE]
    return []


def capture(spec: SideSpec, reference: capture_file.Capture | None = None) -> capture_file.Capture:
    """The capture of ``spec``'s engine over ``spec.sequences``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    substitutions = cpu_substitutions()
    import vllm

    llm = vllm.LLM(**{**ENGINE_DEFAULTS, **spec.model})
    [hooks] = llm.apply_model(_Hooks)
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    per_sequence, logprobs, replayed, rope, offset = [], [], [], [], 0
    for ids in spec.sequences:
        hooks.substitute = None
        [output] = llm.generate([vllm.TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        per_sequence.append([{n: t[: len(ids)] for n, t in layer.items()} for layer in hooks.layers])
        logprobs.extend(_logprobs(output, ids))
        if reference is not None:
            hooks.substitute = [
                tuple(layer[n][offset : offset + len(ids)] for n in ("qkv", "query", "key", "value"))
                for layer in reference.layers
            ]
            llm.generate([vllm.TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
            replayed.append([layer["attention"][: len(ids)] for layer in hooks.layers])
            rope.append([{n: t[: len(ids)] for n, t in layer.pop("rope").items()} for layer in hooks.layers])
        offset += len(ids)
    joined = capture_file.joined(spec, per_sequence, torch.tensor(logprobs), replayed, rope)
    return dataclasses.replace(joined, settings={**joined.settings, "substitutions": substitutions})


if __name__ == "__main__":
    sys.exit(side_main(capture, sys.argv[1:]))
