"""Stand-ins for NeMo-RL, which is not on PyPI and cannot be installed here.

``v0_6/nemo_rl`` is laid out like NeMo-RL >= 0.6 (``nemo_rl.models.megatron.setup`` with the
``_apply_performance_config`` seam; NVIDIA-NeMo/RL 7ea279a) and ``v0_5/nemo_rl`` like 0.5.x (model
config built inline in ``megatron_policy_worker.py``, ``setup_megatron_model``). Module paths,
function names and signatures are NeMo-RL's; bodies keep NeMo-RL's call chain but build a tiny real
megatron-core model on CPU (``cpu_megatron``) instead of loading a checkpoint. Put one version's
directory first on ``sys.path`` to import it as ``nemo_rl``.
"""
