"""``probe``: the same token batch through two engines, compared layer by layer (issue #32).

Each side runs in its own process (its own Python, as NeMo-RL's MCORE and VLLM worker venvs are
apart) and writes a capture file (``capture.py``); the driver compares two captures
(``divergence.py``: the first divergence, attention's measured share, NeMo-RL's mismatch metrics)
and says it in words, JSON and a plot (``render.py``, ``plot.py``). ``megatron_side.py`` captures
a megatron-core GPTModel's forward, ``vllm_side.py`` a vLLM engine's prefill; ``sides.py`` starts
one side's process; ``replay.py`` is the replay estimate beside the measured share.
"""
