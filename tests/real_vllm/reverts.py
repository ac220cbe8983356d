"""Upstream fixes taken back out of the installed vLLM, in the engine's process only, before the
engine is built: ``serve.py`` applies the one its ``ATTN_ALIGN_TEST_REVERT`` names. The shared venv
is never edited; each revert is the smallest change that restores the code before the fix.
"""

from __future__ import annotations

#: The variable ``serve.py`` reads: a key of ``REVERTS``.
REVERT_ENV = "ATTN_ALIGN_TEST_REVERT"


def vllm_27722() -> None:
    """vLLM #27722 (fixed by PR #28244): YaRN's correction range always rounded to whole dimensions,
    whatever the model's ``truncate`` says (gpt-oss: ``truncate: false``). The fix added the
    ``truncate`` argument to ``rotary_embedding/common.py::yarn_find_correction_range``; before it the
    function floored and ceiled unconditionally, which is what this wrapper restores (in ``common``
    and in ``yarn_scaling_rope``, which imported the name)."""
    from vllm.model_executor.layers.rotary_embedding import common, yarn_scaling_rope

    fixed = common.yarn_find_correction_range

    def yarn_find_correction_range(low_rot, high_rot, dim, base=10000, max_position_embeddings=2048, truncate=True):
        return fixed(low_rot, high_rot, dim, base, max_position_embeddings, True)

    common.yarn_find_correction_range = yarn_find_correction_range
    yarn_scaling_rope.yarn_find_correction_range = yarn_find_correction_range


REVERTS = {"vllm-27722": vllm_27722}
