"""Packed boundaries on NeMo-RL's own packing and forward step (issue #38 item 2, upstream bug 5).

``packed_probe.py`` runs 7ea279a's ``process_microbatch`` / ``_pack_sequences_for_megatron`` and
``forward_with_post_processing_fn`` -> ``model_forward`` with ``LogprobsPostProcessor`` on a tiny
megatron-core 0.19.2 GPTModel on CPU with the plugin active (called as megatron-core's schedule calls
them: the schedule itself makes a tensor on ``"cuda"``), once as NeMo-RL ships it and once with
the upstream bug re-introduced into ``train.py`` at import (the ``packed_seq_params`` it hands the
model taken out). What is a stand-in there: Transformer Engine's core attention (CPU stand-in,
``cpu_megatron.PackedAttentionStandIn``) and the two CUDA-only spots of a megatron-core forward
(``cpu_only``); NeMo-RL's ``setup_model_and_optimizer`` is not run (it builds through
Megatron-Bridge's DDP on CUDA): the model goes to the hook as that function's wrapper passes it.
The seams' presence in every ref is read from the sources.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nemo_rl_attn_align.hosts.seams import HOOKS
from nemo_rl_attn_align.vocab.codes import Code
from tests.conftest import module_json
from tests.real_nemo_rl.conftest import REFS, snapshot
from tests.upstream_bugs.packed_probe import LENGTHS

pytestmark = pytest.mark.real_nemo_rl

STAND_INS = Path(__file__).parents[1] / "real_nemo_rl" / "stand_ins"
SITES = [f"decoder.layers.{i}.self_attention.core_attention" for i in range(2)]
PACKED_BY = "nemo_rl.models.megatron.data._pack_sequences_for_megatron"
_probes: dict[str, dict] = {}


def _probe(case: str) -> dict:
    """The probe's facts for ``case``, once per case."""
    if case not in _probes:
        tree = str(snapshot("7ea279a"))
        _probes[case] = module_json("tests.upstream_bugs.packed_probe", tree, case, first_on_path=str(STAND_INS))
    return _probes[case]


def _largest_difference(probe: dict) -> list[float]:
    """Per sequence, the largest difference of a token logprob packed against the sequence alone."""
    return [
        max(abs(a - b) for a, b in zip(packed, alone, strict=True))
        for packed, alone in zip(probe["packed_logprobs"], probe["alone_logprobs"], strict=True)
    ]


def test_the_real_packing_and_forward_state_each_call_with_its_boundaries():
    probe = _probe("fixed")
    assert probe["fix_in_source"] and probe["seam_wrapped_before"]
    thd = {
        "qkv_format": "thd",
        "cu_seqlens_q": 3,
        "cu_seqlens_kv": 3,
        "cu_seqlens_q_padded": 3,
        "cu_seqlens_kv_padded": 3,
    }
    assert probe["detail"]["packed_boundaries"] == {
        "packed_by": PACKED_BY,
        "sequences_packed": len(LENGTHS),
        "built": thd,
        "calls": [{"site": site, "received": thd, "sequences_attended": 3} for site in SITES],
        "not_called": [],
    }
    assert probe["detail"]["coded_findings"] == [] and probe["detail"]["findings"] == []
    assert Code.PACKED_BOUNDARIES_DROPPED.value not in {f["code"] for f in probe["report"]["findings"]}
    # NeMo-RL's packed logprobs are each sequence's own: the boundaries reached the attention
    assert max(_largest_difference(probe)) < 1e-4
    # nothing of the check is left: the seam is NeMo-RL's function again, the model has no hook
    assert not probe["seam_wrapped_after"] and probe["hooks_left"] == []


def test_the_upstream_bug_reintroduced_is_an_error_naming_the_call_and_counts():
    probe = _probe("dropped")
    assert probe["fix_in_source"]  # on disk the fix is there: only this process compiled it out
    statement = probe["detail"]["packed_boundaries"]
    assert statement["sequences_packed"] == 3 and statement["built"]["cu_seqlens_q"] == 3
    assert [(c["site"], c["received"], c["sequences_attended"]) for c in statement["calls"]] == [
        (site, None, 1) for site in SITES
    ]
    [dropped] = probe["detail"]["coded_findings"]
    assert dropped["code"] == Code.PACKED_BOUNDARIES_DROPPED.value and dropped["severity"] == "error"
    assert dropped["key"] == f"workers.policy-rank0.{SITES[0]}" and dropped["value"] == "1 of 3 sequences"
    assert (
        f"packed 3 sequences ({PACKED_BY}; NeMo-RL built PackedSeqParams whose cu_seqlens_q delimits 3)"
        in (dropped["message"])
    )
    assert f"but {SITES[0]} received no packed_seq_params and attended them as 1" in dropped["message"]
    assert probe["report"]["verdict"] == "fail"
    assert [f for f in probe["report"]["findings"] if f["code"] == dropped["code"]] == [dropped]
    first, *later = _largest_difference(probe)
    assert first < 1e-4 and min(later) > 1e-3  # the later sequences attended the earlier ones
    assert not probe["seam_wrapped_after"] and probe["hooks_left"] == []


def test_megatron_bridge_4400_reintroduced_is_an_error_counting_the_truncated_boundaries():
    """The boundaries reach the model, but Megatron-Bridge cut the unpadded ones to nothing: the kernel
    the stand-in replays runs on the padded ones (TE's would fail on an empty cu_seqlens_q), and the
    call attends 0 of 3 sequences apart."""
    probe = _probe("truncated")
    statement = probe["detail"]["packed_boundaries"]
    received = {
        **dict.fromkeys(("cu_seqlens_q", "cu_seqlens_kv"), 0),
        **dict.fromkeys(("cu_seqlens_q_padded", "cu_seqlens_kv_padded"), 3),
    }
    assert [(c["site"], c["received"], c["sequences_attended"]) for c in statement["calls"]] == [
        (site, {"qkv_format": "thd", **received}, 0) for site in SITES
    ]
    [truncated] = probe["detail"]["coded_findings"]
    assert truncated["code"] == Code.PACKED_BOUNDARIES_DROPPED.value and truncated["severity"] == "error"
    assert truncated["key"] == f"workers.policy-rank0.{SITES[0]}" and truncated["value"] == "0 of 3 sequences"
    assert "Megatron-Bridge #4400" in truncated["fix"] and probe["report"]["verdict"] == "fail"


def _parameters(path: Path, function: str) -> list[str] | None:
    tree = ast.parse(path.read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    return [a.arg for a in found[0].args.args] if found else None


@pytest.mark.parametrize("ref", REFS)
def test_every_ref_has_a_packing_seam_the_hook_fits(ref):
    tree = snapshot(ref)
    fitting = []
    for seam in HOOKS["packed_boundaries"].seams:
        path = tree / (seam.module.replace(".", "/") + ".py")
        params = _parameters(path, seam.path) if path.is_file() else None
        if params is not None:
            assert tuple(params[: len(seam.params)]) == seam.params, (ref, seam.module, params)
            fitting.append(f"{seam.module}.{seam.path}")
    expected = "nemo_rl.models.megatron.common" if ref == "v0.5.0" else "nemo_rl.models.megatron.data"
    assert f"{expected}._pack_sequences_for_megatron" in fitting, fitting
