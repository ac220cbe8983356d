"""The table of the engine arguments NeMo-RL's vLLM worker passes itself
(``preflight/tables/vllm_worker_kwargs.json``) is what each ref's own source says today: regenerated
from the snapshots by ``scripts/update_vllm_worker_kwargs.py --check``, which fails while it differs."""

from __future__ import annotations

import pytest

from tests.real_nemo_rl.conftest import REFS, snapshot, table_check

pytestmark = pytest.mark.real_nemo_rl


def test_the_committed_table_is_what_every_refs_worker_source_says():
    trees = [snapshot(ref) for ref in REFS]  # skips outside the lane or without the snapshots
    out = table_check("update_vllm_worker_kwargs.py", str(trees[0].parent), *REFS, timeout=300)
    assert "vllm_worker_kwargs.json is current" in out
