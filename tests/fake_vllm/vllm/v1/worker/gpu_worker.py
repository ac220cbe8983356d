"""Stand-in for ``vllm/v1/worker/gpu_worker.py``: ``Worker`` with vLLM's config attribute names.

``STANDIN_LAYER_BACKENDS`` (env, comma-separated) sets the backend each attention layer reports,
standing in for vLLM's per-layer selection; ``VLLM_ATTENTION_BACKEND``-style requests go through
``attention_config.backend`` as in vLLM >= 0.13. Each layer's ``impl`` has the ``scale`` and the
``sliding_window`` pair vLLM's ``FlashAttentionImpl.__init__`` stores: ``(window - 1, 0)`` for an
HF ``sliding_window``, ``(-1, -1)`` without one.
"""

import os
from types import SimpleNamespace


class _Backend:
    def __init__(self, name):
        self._name = name

    def get_name(self):
        return self._name


def _impl_window(window):
    return (-1, -1) if window is None else (window - 1, 0)


def standin_vllm_config(
    requested=None, layer_backends=("FLASH_ATTN", "FLASH_ATTN"), sliding_window=None, layer_windows=None
):
    """``sliding_window``: the HF config's; ``layer_windows``: each layer's window (default: the HF one)."""
    hf = SimpleNamespace(
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=len(layer_backends),
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=sliding_window,
        rope_theta=10000.0,
        rope_scaling=None,
        vocab_size=128,
    )
    windows = layer_windows if layer_windows is not None else [sliding_window] * len(layer_backends)
    layers = {
        f"model.layers.{i}.self_attn.attn": SimpleNamespace(
            attn_backend=_Backend(name), impl=SimpleNamespace(scale=0.25, sliding_window=_impl_window(window))
        )
        for i, (name, window) in enumerate(zip(layer_backends, windows, strict=True))
    }
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=hf, dtype="torch.bfloat16", tokenizer="standin/tiny", get_head_size=lambda: 16
        ),
        cache_config=SimpleNamespace(cache_dtype="auto", block_size=16, enable_prefix_caching=True),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True, max_num_batched_tokens=2048, max_num_seqs=8),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
        attention_config=SimpleNamespace(backend=requested, flash_attn_version=None),
        compilation_config=SimpleNamespace(static_forward_context=layers),
    )


class Worker:
    def __init__(self, vllm_config=None, local_rank=0, rank=0, distributed_init_method="", is_driver_worker=False):
        if vllm_config is None:
            backends = tuple(os.environ.get("STANDIN_LAYER_BACKENDS", "FLASH_ATTN,FLASH_ATTN").split(","))
            vllm_config = standin_vllm_config(os.environ.get("STANDIN_REQUESTED_BACKEND") or None, backends)
        self.vllm_config = vllm_config
        self.rank = rank
        self.warmed_up = False

    def compile_or_warm_up_model(self):
        self.warmed_up = True
        return 0.0
