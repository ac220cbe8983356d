"""Installs the torchvision stand-in (``attn_align_vllm_stand_ins``) in every interpreter started with
this folder on ``PYTHONPATH``, vLLM's model-inspection subprocesses included."""

import attn_align_vllm_stand_ins  # noqa: F401
