"""The determinism probe: NCCL's list grammar, cuBLAS workspace classes, comparison by meaning,
and probes of real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from nemo_rl_attn_align.binding.determinism import (
    BLOCKING_VARIABLES,
    DetStatus,
    NcclSyntaxError,
    compare,
    cublas_workspace,
    nccl_algorithms,
    nccl_protocols,
    parse_nccl_list,
)
from nemo_rl_attn_align.binding.determinism_probe import DeterminismProbe, probe
from nemo_rl_attn_align.vocab.codes import Code

# NCCL_ALGO value, collective, algorithms NCCL may use (worked out by hand from NCCL's parseList and
# ncclTopoTuneModel: CollNet needs NCCL_COLLNET_ENABLE=1; allgather/reducescatter run ring, PAT,
# NVLS, CollNetDirect; broadcast/reduce run ring only).
ALGO_CASES = [
    (None, "allreduce", ["nvls", "nvlstree", "ring", "tree"]),
    ("Ring", "allreduce", ["ring"]),
    ("ring", "allreduce", ["ring"]),
    ("RING,Tree", "allreduce", ["ring", "tree"]),
    ("allreduce:tree", "allreduce", ["tree"]),
    ("allreduce:tree", "allgather", ["nvls", "pat", "ring"]),
    ("ring,tree;allreduce:tree", "allreduce", ["tree"]),
    ("ring,tree;allreduce:tree", "allgather", ["ring"]),
    ("ring,tree;allreduce:tree", "broadcast", ["ring"]),
    ("^NVLS", "allreduce", ["nvlstree", "ring", "tree"]),
    ("^nvls,nvlstree", "allreduce", ["ring", "tree"]),
    ("allreduce:^tree", "allreduce", ["nvls", "nvlstree", "ring"]),
    ("Tree;allreduce:ring", "allreduce", ["ring"]),
    ("Tree;allreduce:ring", "reducescatter", []),
    ("^", "allreduce", ["nvls", "nvlstree", "ring", "tree"]),
    ("", "allreduce", ["nvls", "nvlstree", "ring", "tree"]),
    ("collnetdirect,ring", "allreduce", ["ring"]),
    ("Ring", "send", []),
]


@pytest.mark.parametrize("raw,collective,expected", ALGO_CASES)
def test_nccl_algo_meaning(raw, collective, expected):
    env = {} if raw is None else {"NCCL_ALGO": raw}
    assert nccl_algorithms(env, collective).value == expected


def test_collnet_and_nvls_switches_narrow_the_algorithms():
    assert nccl_algorithms({"NCCL_COLLNET_ENABLE": "1"}).value == [
        "collnetchain",
        "collnetdirect",
        "nvls",
        "nvlstree",
        "ring",
        "tree",
    ]
    assert nccl_algorithms({"NCCL_NVLS_ENABLE": "0"}).value == ["ring", "tree"]


@pytest.mark.parametrize("raw", ["ring;tree", "bogus", "foo:ring", "allreduce:ring;tree", "ring,bogus"])
def test_values_nccl_refuses_are_invalid(raw):
    with pytest.raises(NcclSyntaxError):
        parse_nccl_list(raw, ("tree", "ring"))
    assert nccl_algorithms({"NCCL_ALGO": raw}).kind == "invalid"


@pytest.mark.parametrize(
    "raw,collective,expected",
    [
        (None, "allreduce", ["ll", "ll128", "simple"]),
        ("Simple", "allreduce", ["simple"]),
        ("LL,Simple;allreduce:^LL", "allreduce", ["ll128", "simple"]),
        ("LL,Simple;allreduce:^LL", "allgather", ["ll", "simple"]),
        ("^LL128;allreduce:LL128", "allreduce", ["ll128"]),
        ("^LL128;allreduce:LL128", "broadcast", ["ll", "simple"]),
    ],
)
def test_nccl_proto_meaning(raw, collective, expected):
    env = {} if raw is None else {"NCCL_PROTO": raw}
    assert nccl_protocols(env, collective).value == expected


@pytest.mark.parametrize(
    "raw,meaning",
    [
        (None, "not_guaranteed"),
        (":4096:8", "deterministic"),
        (":16:8", "deterministic"),
        (":4096:2", "fixed_custom"),
        (":4096:8:16:8", "fixed_custom"),
        ("4096:8", "invalid"),
        ("", "invalid"),
        ("on", "invalid"),
    ],
)
def test_cublas_workspace_classes(raw, meaning):
    assert cublas_workspace(raw).value == meaning


def _diff(training_env, rollout_env, collective="allreduce"):
    return compare(probe(training_env, torch_module=False), probe(rollout_env, torch_module=False), collective)


@pytest.mark.parametrize(
    "name,t,r,status",
    [
        ("CUBLAS_WORKSPACE_CONFIG", ":4096:8", ":16:8", DetStatus.EQUIVALENT),
        ("CUBLAS_WORKSPACE_CONFIG", None, ":4096:8", DetStatus.MISMATCH),
        ("CUBLAS_WORKSPACE_CONFIG", ":4096:2", ":4096:8", DetStatus.MISMATCH),
        ("CUBLAS_WORKSPACE_CONFIG", None, None, DetStatus.MATCH),
        ("NCCL_ALGO", "Ring", "ring", DetStatus.EQUIVALENT),
        ("NCCL_ALGO", None, "^", DetStatus.EQUIVALENT),
        ("NCCL_ALGO", "allreduce:tree", "ring,tree;allreduce:tree", DetStatus.EQUIVALENT),
        ("NCCL_ALGO", "Ring", "allreduce:tree", DetStatus.MISMATCH),
        ("NCCL_ALGO", "Ring", "Tree;allreduce:ring", DetStatus.EQUIVALENT),
        ("NCCL_ALGO", "bogus", "bogus", DetStatus.MATCH),
        ("NCCL_ALGO", "bogus", "BOGUS", DetStatus.MISMATCH),
        ("NCCL_PROTO", None, "Simple", DetStatus.MISMATCH),
        ("NCCL_PROTO", "simple", "Simple", DetStatus.EQUIVALENT),
        ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0", None, DetStatus.DIFFERENT),
        ("VLLM_BATCH_INVARIANT", "1", "1", DetStatus.MATCH),
        ("NCCL_MAX_NCHANNELS", "1", None, DetStatus.DIFFERENT),
    ],
)
def test_compared_by_meaning_not_by_string(name, t, r, status):
    env_t = {} if t is None else {name: t}
    env_r = {} if r is None else {name: r}
    entry = _diff(env_t, env_r).entry(name)
    assert entry.status is status
    assert entry.blocking is (status is DetStatus.MISMATCH)
    assert (name in BLOCKING_VARIABLES) is entry.blocking_tier


def test_unset_and_set_to_the_default_are_different_facts():
    entry = _diff({}, {"NCCL_ALGO": "^"}).entry("NCCL_ALGO")
    assert entry.status is DetStatus.EQUIVALENT and (entry.training, entry.rollout) == (None, "^")
    assert "training unset" in entry.note and "rollout set to '^'" in entry.note
    assert probe({}, torch_module=False).env["NCCL_ALGO"] is None
    assert probe({"NCCL_ALGO": ""}, torch_module=False).env["NCCL_ALGO"] == ""


def test_the_collective_that_reduces_the_compared_tensor_decides():
    t, r = {"NCCL_ALGO": "allreduce:tree"}, {"NCCL_ALGO": "ring,tree;allreduce:tree"}
    assert _diff(t, r, "allreduce").entry("NCCL_ALGO").status is DetStatus.EQUIVALENT
    assert _diff(t, r, "allgather").entry("NCCL_ALGO").status is DetStatus.MISMATCH  # {pat, nvls, ring} vs {ring}
    none = _diff({"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}, None).entry("NCCL_ALGO")
    assert none.status is DetStatus.DIFFERENT and not none.blocking_tier
    with pytest.raises(ValueError, match="unknown collective"):
        _diff({}, {}, "all_to_all")


# --- probes of real processes -------------------------------------------------------------------


def _child(code: str, env: dict[str, str]) -> dict:
    base = {
        k: v for k, v in __import__("os").environ.items() if not k.startswith(("NCCL_", "CUBLAS_", "VLLM_", "NVTE_"))
    }
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_probe_in_a_real_process_reads_env_and_torch_flags():
    pytest.importorskip("torch")
    result = _child(
        """
        import json, os, torch
        from nemo_rl_attn_align.binding.determinism import probe
        from nemo_rl_attn_align.binding.profiles import PROFILES
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        before = probe().to_dict()
        # what vLLM's batch-invariant mode does inside its worker, after the process started
        os.environ.update(PROFILES["vllm-batch-invariant"].overrides)
        after = probe().to_dict()
        print(json.dumps({"before": before, "after": after}))
    """,
        {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN", "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
    )
    before = DeterminismProbe.from_dict(result["before"])
    after = DeterminismProbe.from_dict(result["after"])
    assert before.torch_status == "probed"
    assert before.torch["matmul_allow_tf32"] is True and before.torch["deterministic_algorithms"] is True
    assert before.torch["deterministic_algorithms_warn_only"] is True
    assert before.env["NCCL_ALGO"] == "Ring" and before.env["NCCL_DEBUG"] == "WARN"  # every NCCL_* present is kept
    assert before.env["NCCL_PROTO"] is None and before.env["VLLM_BATCH_INVARIANT"] is None
    assert after.env["NCCL_ALGO"] == "allreduce:tree" and after.env["NCCL_PROTO"] == "Simple"
    diff = compare(before, after, "allreduce")
    assert {e.name for e in diff.entries if e.blocking} == {"NCCL_ALGO", "NCCL_PROTO"}
    assert diff.entry("CUBLAS_WORKSPACE_CONFIG").status is DetStatus.EQUIVALENT


def test_probe_without_torch_records_it_cleanly():
    result = _child(
        """
        import json, sys
        sys.modules["torch"] = None  # torch cannot be imported in this process
        from nemo_rl_attn_align.binding.determinism import probe
        print(json.dumps(probe().to_dict()))
    """,
        {"NCCL_PROTO": "Simple"},
    )
    p = DeterminismProbe.from_dict(result)
    assert p.torch is None and p.torch_status.startswith("unavailable: ")
    assert p.env["NCCL_PROTO"] == "Simple"


def test_a_side_without_torch_flags_is_listed_as_not_probed():
    torch = pytest.importorskip("torch")
    diff = compare(probe({}, torch_module=torch), probe({}, torch_module=False))
    statuses = {e.status for e in diff.entries if e.kind == "torch"}
    assert statuses == {DetStatus.NOT_PROBED}
    codes = [f.code for f in diff.findings()]
    assert codes.count(Code.DET_NOT_PROBED.value) == 1


def test_probe_round_trips_and_refuses_bad_records():
    p = probe({"NCCL_ALGO": "Ring"}, torch_module=False)
    assert DeterminismProbe.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError):
        DeterminismProbe.from_dict({"env": {"NCCL_ALGO": 1}, "torch": None, "torch_status": "x"})
    with pytest.raises(ValueError):
        DeterminismProbe.from_dict({"env": {}})
