"""nemo-rl-attn-align: attention-backend checks and train/rollout attention contracts for NeMo-RL.

Importing this package imports nothing heavy: torch, megatron-core, vllm and ray are imported
only inside the functions that need them.
"""

__version__ = "0.1.0"
