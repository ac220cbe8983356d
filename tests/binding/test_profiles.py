"""The framework profiles: what Megatron's deterministic mode and vLLM's batch-invariant mode do to
the environment, by version, and how the results compare by meaning."""

from __future__ import annotations

import pytest

from nemo_rl_attn_align.binding.determinism import DetStatus, compare
from nemo_rl_attn_align.binding.determinism_probe import probe
from nemo_rl_attn_align.binding.profiles import PROFILES
from nemo_rl_attn_align.preflight.generation_facts import vllm_batch_invariant
from nemo_rl_attn_align.vocab.errors import Severity


def _diff(training_env, rollout_env, collective="allreduce"):
    return compare(probe(training_env, torch_module=False), probe(rollout_env, torch_module=False), collective)


# --- the frameworks, by version (Megatron-LM determinism.py at 3ab71ee; vLLM batch_invariant.py) --


def test_megatron_legacy_deterministic_mode_asserts_an_exact_nccl_algo_string():
    legacy = PROFILES["megatron-deterministic-legacy"]
    assert legacy.apply({})[1] and legacy.apply({"NCCL_ALGO": "ring"})[1]  # exact string match: lower case fails
    env, problems = legacy.apply({"NCCL_ALGO": "Tree"})
    assert problems == [] and env == {"NCCL_ALGO": "Tree"}  # it sets nothing


def test_megatron_deterministic_mode_after_3ab71ee_defaults_ring_and_rejects_tree():
    current = PROFILES["megatron-deterministic"]
    env, problems = current.apply({})
    assert (env["NCCL_ALGO"], env["CUBLAS_WORKSPACE_CONFIG"], problems) == ("Ring", ":4096:8", [])
    assert current.apply({"CUBLAS_WORKSPACE_CONFIG": ":16:8"})[0]["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert current.apply({"CUBLAS_WORKSPACE_CONFIG": ":4096:2"})[0]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert current.apply({"NCCL_ALGO": "Tree"})[1] == ["megatron-deterministic rejects NCCL_ALGO='Tree'"]
    assert current.apply({"NCCL_ALGO": "allreduce:tree"})[0]["NCCL_ALGO"] == "Ring"


def _profile_env(name, env=None):
    return PROFILES[name].apply(env or {})[0]


def test_vllm_batch_invariant_versions_mean_the_same_for_allreduce():
    old, new = _profile_env("vllm-batch-invariant"), _profile_env("vllm-batch-invariant-0.33")
    assert (old["NCCL_ALGO"], new["NCCL_ALGO"]) == ("allreduce:tree", "ring,tree;allreduce:tree")
    diff = _diff(old, new, "allreduce")
    assert not diff.blocking
    assert {e.name: e.status for e in diff.entries if e.status is not DetStatus.MATCH} == {
        "NCCL_ALGO": DetStatus.EQUIVALENT,
        "CUBLAS_WORKSPACE_CONFIG": DetStatus.EQUIVALENT,
    }
    assert _diff(old, new, "allgather").blocking  # ... but not for every collective


@pytest.mark.parametrize(
    "training,rollout,collective,blocking",
    [
        ("megatron-deterministic", "vllm-batch-invariant", "allreduce", {"NCCL_ALGO", "NCCL_PROTO"}),
        ("megatron-deterministic", "vllm-batch-invariant-0.33", "allreduce", {"NCCL_ALGO", "NCCL_PROTO"}),
        ("megatron-deterministic", "vllm-batch-invariant", None, set()),
        (None, "vllm-batch-invariant", "allreduce", {"NCCL_ALGO", "NCCL_PROTO", "CUBLAS_WORKSPACE_CONFIG"}),
        (None, "vllm-batch-invariant", None, {"CUBLAS_WORKSPACE_CONFIG"}),
        (None, None, "allreduce", set()),
        ("megatron-deterministic", None, "allreduce", {"NCCL_ALGO", "CUBLAS_WORKSPACE_CONFIG"}),
    ],
)
def test_determinism_classes_across_frameworks(training, rollout, collective, blocking):
    t_env = _profile_env(training) if training else {}
    r_env = _profile_env(rollout) if rollout else {}
    diff = _diff(t_env, r_env, collective)
    assert {e.name for e in diff.entries if e.blocking} == blocking
    errors = {f.key for f in diff.findings() if f.severity is Severity.ERROR}
    assert errors == {f"determinism.{name}" for name in blocking}


@pytest.mark.parametrize(
    "requested", [None, "Ring", "CollnetDirect", "CollnetChain", "^NVLS", "allreduce:tree", "Tree"]
)
def test_after_3ab71ee_megatron_deterministic_cannot_share_vllm_batch_invariant_allreduce(requested):
    """vLLM's batch-invariant mode reduces allreduce by Tree; Megatron's current deterministic mode
    lets no Tree through (rejected, or replaced by Ring); its legacy rule accepted exactly "Tree"."""
    vllm = _profile_env("vllm-batch-invariant")
    user = {"NCCL_PROTO": "Simple", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    if requested is not None:
        user["NCCL_ALGO"] = requested
    env, problems = PROFILES["megatron-deterministic"].apply(user)
    assert problems or _diff(env, vllm, "allreduce").entry("NCCL_ALGO").blocking
    legacy_env, legacy_problems = PROFILES["megatron-deterministic-legacy"].apply(user)
    agrees = not legacy_problems and not _diff(legacy_env, vllm, "allreduce").blocking
    assert agrees is (requested == "Tree")


def test_vllm_batch_invariant_switch_reads_an_integer():
    assert vllm_batch_invariant({"VLLM_BATCH_INVARIANT": "1"}) and vllm_batch_invariant({"VLLM_BATCH_INVARIANT": "2"})
    assert not any(
        vllm_batch_invariant(e) for e in ({}, {"VLLM_BATCH_INVARIANT": "0"}, {"VLLM_BATCH_INVARIANT": "true"})
    )
