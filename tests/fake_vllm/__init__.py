"""Stand-in for vLLM's worker module (vLLM needs a GPU; it cannot run here).

``vllm/v1/worker/gpu_worker.py`` has vLLM's module path, class name and seam
(``Worker.compile_or_warm_up_model``, called after the model is loaded and the KV cache
allocated), and a ``vllm_config`` whose attribute names are vLLM's (0.13+ layout, with
``attention_config``). Put this directory first on ``sys.path`` to import it as ``vllm``.
"""
