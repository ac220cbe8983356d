"""What a framework mode does to a process's environment, per version, with its source.

``PROFILES`` holds Megatron's deterministic mode (before and after Megatron-LM 3ab71ee) and vLLM's
batch-invariant mode (before and from 0.33); ``vllm_batch_invariant`` reads the switch that turns
the latter on. The preview and the tests apply them to an environment; ``compare`` in
``binding/determinism.py`` then reads the result by meaning. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nemo_rl_attn_align.binding.determinism import DETERMINISTIC_CUBLAS, describe_env_value


@dataclass(frozen=True)
class Profile:
    """What a framework mode does to a process's environment, for one version range.

    ``overrides`` are always written; ``defaults`` maps a variable to (accepted values, default):
    a value outside the accepted ones is replaced by the default; ``requires`` maps a variable to
    the values it must already have (the framework asserts); ``rejects`` to values it refuses.
    Torch flags are not modelled here: both modes change them inside the process (Megatron turns
    on ``torch.use_deterministic_algorithms``; vLLM's batch-invariant mode sets fp32_precision
    "ieee" and turns reduced-precision reductions off), which only a probe there can see.
    """

    name: str
    versions: str
    source: str
    overrides: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rejects: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def apply(self, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """The environment after this mode ran, and the problems it stops on (empty when none)."""
        out = dict(env)
        problems = []
        for name, values in self.rejects.items():
            if out.get(name) in values:
                problems.append(f"{self.name} rejects {name}={out[name]!r}")
        for name, values in self.requires.items():
            if out.get(name) not in values:
                found = describe_env_value(out.get(name))
                problems.append(f"{self.name} requires {name} in {list(values)}, found {found}")
        for name, (accepted, default) in self.defaults.items():
            if out.get(name) not in accepted:
                out[name] = default
        out.update(self.overrides)
        return out, problems


_VLLM_BI_BASE = {
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    "NCCL_LAUNCH_MODE": "GROUP",
    "NCCL_COLLNET_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1",
    "NCCL_MAX_NCHANNELS": "1",
    "NCCL_PROTO": "Simple",
    "NCCL_NTHREADS": "1",
    "NCCL_SOCKET_NTHREADS": "1",
    "VLLM_USE_AOT_COMPILE": "0",
}
#: Known modes, keyed by name; ``binding_preview`` and the tests use them.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "megatron-deterministic-legacy",
            "Megatron-LM/Megatron-Bridge before 3ab71ee (2026-07-08)",
            "megatron/training/arguments.py validate_args; Megatron-Bridge _validate_deterministic_mode",
            requires={"NCCL_ALGO": ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")},
        ),
        Profile(
            "megatron-deterministic",
            "Megatron-LM 3ab71ee (2026-07-08) and later",
            "Megatron-LM megatron/training/determinism.py apply_determinism_env (added in 3ab71ee)",
            defaults={
                "NCCL_ALGO": (("Ring", "CollnetDirect", "CollnetChain", "^NVLS", "Tree"), "Ring"),
                "CUBLAS_WORKSPACE_CONFIG": (DETERMINISTIC_CUBLAS, ":4096:8"),
            },
            rejects={"NCCL_ALGO": ("Tree",)},
        ),
        Profile(
            "vllm-batch-invariant",
            "vLLM 0.11.2 to 0.32 (VLLM_BATCH_INVARIANT=1)",
            "vllm/model_executor/layers/batch_invariant.py override_envs_for_invariance, init_batch_invariance",
            overrides={**_VLLM_BI_BASE, "NCCL_ALGO": "allreduce:tree", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
        ),
        Profile(
            "vllm-batch-invariant-0.33",
            "vLLM 0.33 and later, NCCL >= 2.31, sm90+ (VLLM_BATCH_INVARIANT=1)",
            "vLLM PR #58179 (NCCL_ALGO); vllm/model_executor/layers/batch_invariant.py "
            "enable_batch_invariant_mode (:16:8 on sm90/sm100; read at 0188c01)",
            overrides={**_VLLM_BI_BASE, "NCCL_ALGO": "ring,tree;allreduce:tree", "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
        ),
    )
}
