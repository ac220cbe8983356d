"""Stand-in for ``vllm/v1/worker/cpu_worker.py``: ``CPUWorker(Worker)`` overrides
``compile_or_warm_up_model`` without calling ``super()``, as vLLM's does (0.25.1, 0.32.0)."""

from vllm.v1.worker.gpu_worker import Worker


class CPUWorker(Worker):
    def compile_or_warm_up_model(self):
        self.warmed_up = "cpu"
        return 0.0
