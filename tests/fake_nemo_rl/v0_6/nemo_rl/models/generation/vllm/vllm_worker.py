"""Stand-in for ``nemo_rl/models/generation/vllm/vllm_worker.py``: ``VllmGenerationWorker``.

Upstream builds ``vllm.LLM(...)`` in the constructor; with TP = 1 the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its ``gpu_worker.Worker`` warms up there. The stand-in
does that with ``tests/fake_vllm``. A RANK listed in ``STANDIN_DIE_RANKS`` dies (``os._exit``) before
its engine is up, as a worker killed by the OOM killer would; once the file ``STANDIN_DIE_AFTER``
names exists, if set (a test points it at another worker's record to fix the order).
"""

import os
import time


class VllmGenerationWorker:
    def __init__(self, config):
        rank = os.environ.get("RANK", "0")
        if rank in os.environ.get("STANDIN_DIE_RANKS", "").split(","):
            after = os.environ.get("STANDIN_DIE_AFTER")
            deadline = time.monotonic() + 120
            while after and not os.path.exists(after) and time.monotonic() < deadline:
                time.sleep(0.05)
            os._exit(3)
        import vllm.v1.worker.gpu_worker as gpu_worker

        self.engine_worker = gpu_worker.Worker(rank=0)
        self.engine_worker.compile_or_warm_up_model()

    def post_init(self):
        return self.engine_worker.warmed_up
