"""The training side: a megatron-core GPTModel's forward over the batch, captured by forward hooks.

``python -m nemo_rl_attn_align.probe.megatron_side SIDE_JSON OUT [REFERENCE]`` writes the capture
of ``SIDE_JSON`` (``sides.SideSpec``'s fields) to ``OUT``; with ``REFERENCE`` (another side's
capture) it also runs its own core attention on the reference's query/key/value, and a second
forward with every layer's QKV output replaced by the reference's, whose attention inputs are its
own RoPE on the reference's query and key. The model is
built from ``model`` (``TransformerConfig`` fields and the ``GPTModel`` arguments of ``GPT_ARGS``)
with the local layer spec and seeded weights (made on the CPU, so two sides with one seed hold the
same weights on any device), then run on the GPU when there is one; ``params_dtype`` may be named
(``"bfloat16"``). Off a GPU, the two CUDA-only spots of a megatron-core forward are replaced
(``cpu_only``), and the capture names them (``settings["substitutions"]``). ``capture_model`` is
also the Megatron-Bridge side's (``bridge_side.py``): the hooks, the layouts and the replays are one
code for both engines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import types
from typing import Any

from nemo_rl_attn_align.probe import capture as capture_file
from nemo_rl_attn_align.probe.sides import SideSpec, side_main

#: GPTModel arguments (the rest of ``model`` is TransformerConfig's) and their defaults.
GPT_ARGS = {"vocab_size": 128, "max_sequence_length": 64, "position_embedding_type": "rope", "rotary_base": 10000}
#: A tiny model: what ``model`` is laid over.
TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2, "ffn_hidden_size": 128}
#: What ``cpu_only`` replaces, as the capture names it.
CPU_ONLY = ("torch.cuda.current_device: 'cpu'", "CUDA RNG tracker fork: no-op")


def ensure_model_parallel() -> None:
    """A gloo process group of one and Megatron's model-parallel state, once per process (on a GPU
    also the CUDA RNG tracker a megatron-core forward forks)."""
    import torch
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        if torch.cuda.is_available():
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(0)


def build(spec: SideSpec) -> Any:
    """The side's GPTModel (local layer spec and backend, weights from ``spec.seed``), in eval mode."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    ensure_model_parallel()
    settings = {**TINY, **GPT_ARGS, "attention_backend": "local", **spec.model}
    gpt = {k: settings.pop(k) for k in GPT_ARGS}
    settings["attention_backend"] = AttnBackend[settings["attention_backend"]]
    if isinstance(settings.get("params_dtype"), str):
        settings["params_dtype"] = getattr(torch, settings["params_dtype"])
    config = TransformerConfig(**{"use_cpu_initialization": True, **settings})
    torch.manual_seed(spec.seed)
    with own_nvte_environment():
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), **gpt)
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


@contextlib.contextmanager
def own_nvte_environment():
    """Megatron asserts and then sets ``NVTE_*`` for its backend while it builds; the probe leaves
    its process's environment as it found it (the run it probes, or the next side in a test)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("NVTE_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("NVTE_")]:
            del os.environ[key]
        os.environ.update(saved)


@contextlib.contextmanager
def cpu_only():
    """Off a GPU: ``torch.cuda.current_device`` answers "cpu" and the CUDA RNG tracker's fork does nothing."""
    import torch
    from megatron.core import tensor_parallel

    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.current_device, tensor_parallel.get_cuda_rng_tracker
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    tensor_parallel.get_cuda_rng_tracker = lambda: types.SimpleNamespace(fork=contextlib.nullcontext)
    try:
        yield
    finally:
        torch.cuda.current_device, tensor_parallel.get_cuda_rng_tracker = saved


class _Hooks:
    """Forward hooks on every layer, keeping the capture's tensors of the current sequence."""

    def __init__(self, model: Any):
        self.layers: list[dict[str, Any]] = [{} for _ in model.decoder.layers]
        self.calls: list[tuple[tuple, dict]] = [((), {}) for _ in model.decoder.layers]
        #: per layer, the QKV output (megatron's layout) that replaces the layer's own (None: none)
        self.substitute_qkv: list[Any] | None = None
        self.handles = []
        for i, layer in enumerate(model.decoder.layers):
            attn = layer.self_attention
            self._on(attn.linear_qkv, i, "qkv", output=True)
            self.handles.append(attn.linear_qkv.register_forward_hook(self._substituted(i)))
            self.handles.append(attn.core_attention.register_forward_pre_hook(self._inputs(i), with_kwargs=True))
            self._on(attn.core_attention, i, "attention", output=True)
            self._on(layer.pre_mlp_layernorm, i, "after_attention", output=False)
            self._on(layer, i, "after_mlp", output=True)

    def _on(self, module: Any, index: int, name: str, output: bool) -> None:
        def keep(_module, args, out=None):
            value = out if output else args[0]
            self.layers[index][name] = (value[0] if isinstance(value, tuple) else value).detach().clone()

        self.handles.append(module.register_forward_hook(keep) if output else module.register_forward_pre_hook(keep))

    def _substituted(self, index: int):
        def swap(_module, _args, out):
            if self.substitute_qkv is None:
                return None
            return (self.substitute_qkv[index], *out[1:]) if isinstance(out, tuple) else self.substitute_qkv[index]

        return swap

    def _inputs(self, index: int):
        def keep(_module, args, kwargs):
            query, key, value = (t.detach().clone() for t in args[:3])
            self.layers[index].update(query=query, key=key, value=value)
            self.calls[index] = (args[3:], kwargs)

        return keep

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _tokens_first(tensor: Any) -> Any:
    """Megatron's ``[seq, batch, ...]`` (batch 1) as the capture's ``[tokens, ...]``."""
    return tensor.transpose(0, 1).reshape(-1, *tensor.shape[2:])


def _unpacked_qkv(mixed: Any, heads: int, groups: int) -> Any:
    """Megatron's QKV output (per query group: its queries, one key, one value) as ``[q | k | v]``,
    the layout vLLM's ``qkv_proj`` and the capture use."""
    import torch

    tokens = mixed.shape[0]
    per_group = mixed.view(tokens, groups, heads // groups + 2, -1)
    query, key, value = per_group[:, :, :-2], per_group[:, :, -2], per_group[:, :, -1]
    return torch.cat([t.reshape(tokens, -1) for t in (query, key, value)], dim=-1)


def unwrapped(model: Any) -> Any:
    """The GPTModel inside its wrappers (``Float16Module`` and the like hold it as ``module``)."""
    while not hasattr(model, "decoder") and hasattr(model, "module"):
        model = model.module
    return model


def _packed_qkv(flat: Any, heads: int, groups: int) -> Any:
    """The capture's ``[q | k | v]`` in megatron's QKV layout (per query group: its queries, one key,
    one value): ``_unpacked_qkv``'s inverse."""
    import torch

    tokens, dim = flat.shape[0], flat.shape[1] // (heads + 2 * groups)
    query, key, value = flat.split([heads * dim, groups * dim, groups * dim], dim=-1)
    parts = [query.view(tokens, groups, heads // groups, dim), key.view(tokens, groups, 1, dim)]
    return torch.cat([*parts, value.view(tokens, groups, 1, dim)], dim=2).reshape(tokens, -1)


def _replayed_rope(model: Any, hooks: _Hooks, inputs: tuple, reference: list[dict[str, Any]]) -> list[dict]:
    """A forward with every layer's QKV output replaced by the reference's: the query and key that
    reach core attention are this side's RoPE on the reference's."""
    device, dtype, tokens = inputs[0].device, unwrapped(model).config.params_dtype, inputs[0].shape[1]
    hooks.substitute_qkv = [
        _packed_qkv(ref["qkv"], ref["query"].shape[1], ref["key"].shape[1]).to(device, dtype).reshape(tokens, 1, -1)
        for ref in reference
    ]
    try:
        model(*inputs[:2], attention_mask=inputs[2])
    finally:
        hooks.substitute_qkv = None
    return [{n: _tokens_first(layer[n]).cpu() for n in ("query", "key")} for layer in hooks.layers]


def _forward_one(
    model: Any, hooks: _Hooks, ids: list[int], reference: list[dict[str, Any]] | None
) -> tuple[list, Any, list, list]:
    """One sequence: its layers' tensors, its next-token logprobs, and per layer its attention and
    its RoPE replayed on the reference's inputs."""
    import torch

    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    positions = torch.arange(len(ids), device=device).unsqueeze(0)
    causal = torch.triu(torch.ones(1, 1, len(ids), len(ids), dtype=torch.bool, device=device), diagonal=1)
    logits = model(tokens, positions, attention_mask=causal)
    logprobs = torch.log_softmax(logits.float(), dim=-1)[0, :-1].gather(-1, tokens[0, 1:, None])[:, 0]
    layers = [{k: _tokens_first(v).cpu() for k, v in layer.items()} for layer in hooks.layers]
    for layer in layers:
        layer["qkv"] = _unpacked_qkv(layer["qkv"], layer["query"].shape[1], layer["key"].shape[1])
    replayed, rope = [], []
    if reference is not None:
        for i, layer in enumerate(unwrapped(model).decoder.layers):
            rest, kwargs = hooks.calls[i]
            qkv = [reference[i][n].reshape(len(ids), 1, *reference[i][n].shape[1:]) for n in ("query", "key", "value")]
            qkv = [t.to(device=device, dtype=unwrapped(model).config.params_dtype) for t in qkv]
            replayed.append(_tokens_first(layer.self_attention.core_attention(*qkv, *rest, **kwargs)).cpu())
        rope = _replayed_rope(model, hooks, (tokens, positions, causal), reference)
    return layers, logprobs.cpu(), replayed, rope


def _slice(reference: capture_file.Capture, offset: int, length: int) -> list[dict[str, Any]]:
    """The reference's layers at one sequence's tokens."""
    return [{n: t[offset : offset + length] for n, t in layer.items()} for layer in reference.layers]


def capture(spec: SideSpec, reference: capture_file.Capture | None = None) -> capture_file.Capture:
    """The capture of ``spec``'s model over ``spec.sequences``."""
    return capture_model(build(spec), spec, reference)


def capture_model(
    model: Any, spec: SideSpec, reference: capture_file.Capture | None = None, substitutions: tuple[str, ...] = ()
) -> capture_file.Capture:
    """The capture of ``model`` over ``spec.sequences`` (one forward per sequence); ``substitutions``
    name what the side replaced to build it here (``cpu_only``'s own are added off a GPU)."""
    import torch

    hooks = _Hooks(unwrapped(model))
    per_sequence, logprobs, replayed, rope = [], [], [], []
    offset = 0
    try:
        with cpu_only(), torch.no_grad():
            for ids in spec.sequences:
                ref = None if reference is None else _slice(reference, offset, len(ids))
                layers, lp, rep, rotated = _forward_one(model, hooks, ids, ref)
                per_sequence.append(layers)
                logprobs.append(lp)
                replayed.append(rep)
                rope.append(rotated)
                offset += len(ids)
    finally:
        hooks.remove()
    replays = (replayed, rope) if reference is not None else ([], None)
    joined = capture_file.joined(spec, per_sequence, torch.cat(logprobs), *replays)
    named = [*substitutions, *(() if torch.cuda.is_available() else CPU_ONLY)]
    return dataclasses.replace(joined, settings={**joined.settings, "substitutions": named})


if __name__ == "__main__":
    sys.exit(side_main(capture, sys.argv[1:]))
