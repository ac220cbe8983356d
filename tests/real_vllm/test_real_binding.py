"""Real against real: one tiny Qwen3 served by a real vLLM engine and built as a real megatron-core
GPTModel on CPU through the training hook; the report binds the two contracts the hooks wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from nemo_rl_attn_align.config.settings import AlignSettings
from nemo_rl_attn_align.report.document import collect
from nemo_rl_attn_align.report.report_render import render_summary
from nemo_rl_attn_align.vocab.mandate import Mandate
from nemo_rl_attn_align.vocab.schema import Tier, fields_of
from tests.hosts.conftest import FAKE_NEMO_RL, REPO
from tests.real_vllm.conftest import HERE
from tests.real_vllm.train_side import transformer_config

#: No semantic demand (every mandate field None).
NO_DEMAND = AlignSettings(mandate=Mandate(None, None, None, None, None))

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def bound(engines, tmp_path_factory):
    engine = engines("qwen3")
    report_dir = tmp_path_factory.mktemp("real-binding") / "report"
    shutil.copytree(engine.report_dir, report_dir)
    hf = json.loads((engine.model / "config.json").read_text())
    spec = {
        "paths": [str(FAKE_NEMO_RL / "v0_6"), str(REPO)],
        "model": transformer_config(hf),
        "tokenizer": str(engine.model),
    }
    env = {"NEMO_RL_ATTN_ALIGN_REPORT_DIR": str(report_dir), "PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run(
        [sys.executable, str(HERE / "train_side.py"), json.dumps(spec)],
        env=env,
        cwd=report_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "TRAIN_SIDE_DONE" in done.stdout, done.stderr[-4000:]
    # No mandate: the CPU stand-in for TE is megatron-core's local attention, one full softmax, which the
    # default mandate (online_softmax_lse) refuses by design; the sides are bound against each other.
    return collect(report_dir, NO_DEMAND)


def test_both_real_contracts_are_bound(bound):
    assert [(c["side"], c["worker_id"]) for c in bound["contracts"]] == [
        ("rollout", "vllm-rank0-worker0"),
        ("training", "policy-rank0"),
    ]
    assert bound["binding"] is not None and bound["workers"]["missing"] == []


def test_identity_passes_on_every_field_both_sides_observe(bound):
    rows = {r["field"]: r for r in bound["binding"]["fields"]}
    known = ("observed", "configured")
    both = [
        n
        for n in fields_of(Tier.IDENTITY)
        if rows[n]["training"]["provenance"] in known and rows[n]["rollout"]["provenance"] in known
    ]
    assert {r: rows[r]["status"] for r in both} == {r: "match" for r in both}
    # The tokenizer binds by content: two different path spellings of the same files would too.
    assert rows["tokenizer"]["training"]["value"] == rows["tokenizer"]["rollout"]["value"]
    assert rows["tokenizer"]["training"]["value"].startswith("sha256:")
    assert set(both) >= {
        "num_layers",
        "num_attention_heads",
        "num_query_groups",
        "head_dim",
        "softmax_scale",
        "causal",
        "sliding_window",
        "layer_windows",
        "logit_softcapping",
        "rope_type",
        "rope_parameters",
        "vocab_size",
        "tokenizer",
        "rope",
        "mask",
        "softmax",
    }
    assert rows["dtype"]["status"] == "match"


def test_what_stays_unobservable_is_listed_never_a_match(bound):
    rows = {r["field"]: r for r in bound["binding"]["fields"]}
    unobservable = {
        n for n, r in rows.items() if "unobservable" in (r["training"]["provenance"], r["rollout"]["provenance"])
    }
    assert {
        "architecture",
        "batch_size",
    } <= unobservable  # Megatron's config has no HF class; nobody knows the batch yet
    statuses = {n: rows[n]["status"] for n in unobservable if rows[n]["tier"] != "recorded"}
    assert statuses == {n: "not_comparable" for n in statuses}, statuses
    assert all(rows[n]["status"] != "match" for n in unobservable)
    listed = {f["key"].rsplit(".", 1)[-1] for f in bound["findings"] if f["code"] == "ATTN_UNOBSERVABLE"}
    assert {n for n in unobservable if rows[n]["tier"] != "recorded"} <= listed
    # nothing disagrees (passed), but what one side cannot see keeps the verdict from pass
    assert bound["verdict"] == "incomparable" and bound["binding"]["passed"] is True
    summary = render_summary(bound, full=True)
    print(summary)
    assert "architecture" in summary and "not_comparable" in summary and "verdict INCOMPARABLE" in summary
