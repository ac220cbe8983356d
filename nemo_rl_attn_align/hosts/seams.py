"""The host functions the hooks wrap, declared once as data (stdlib only, importing nothing:
``bootstrap`` derives its watch list from ``HOOKS`` at interpreter start).

A ``Seam`` is one function of a host module: the module, the attribute path in it, the leading
parameters its wrapper relies on (by name) and the wrapper (the name of a factory in the hook module,
called with the original function and the seam). ``hooks.Hook`` wraps each seam where the installed
host fits it and names it in one warning where not. Upstream sources read: NVIDIA-NeMo/RL 7ea279a,
v0.7.0, v0.6.0, v0.5.0; vLLM 0.25.1 to 0.33; Transformer Engine >= 2.4.
"""

#: The group of a seam a host version may lack: skipped without a word.
OPTIONAL = "optional"


class Seam:
    """One function a hook wraps. ``group``: None (it must fit), ``OPTIONAL``, or a layout's name
    (the seams of one layout fit together, else none of them is wrapped; a module's layouts are
    alternatives, tried in order)."""

    __slots__ = ("group", "module", "params", "path", "wrapper")

    def __init__(self, module: str, path: str, params: tuple, wrapper: str, group: str | None = None):
        self.module, self.path, self.params, self.wrapper, self.group = module, path, params, wrapper, group


class HookSeams:
    """One hook module's seams, the host its warnings name, the hosts whose versions it checks
    (``host_versions.SUPPORTED``) when it first patches, and the host versions of its layouts."""

    __slots__ = ("checks", "host", "layouts", "seams")

    def __init__(self, host: str, checks: tuple, seams: tuple, layouts: dict | None = None):
        self.host, self.checks, self.seams, self.layouts = host, checks, seams, layouts or {}


_ALGORITHMS = "nemo_rl.algorithms."
#: ``setup(master_config, ...)`` of each algorithm (ppo and xtoken_off_policy_distillation since 0.7.0).
_SETUPS = ("distillation", "dpo", "grpo", "ppo", "rm", "sft", "xtoken_off_policy_distillation")
#: The train functions by algorithm module; a NeMo-RL version may lack some of them.
_TRAIN = {
    "distillation": ("distillation_train",),
    "dpo": ("dpo_train",),
    "grpo": ("grpo_train", "async_grpo_train"),
    "grpo_sync": ("grpo_train_sync",),
    "ppo": ("ppo_train", "async_ppo_train"),
    "rm": ("rm_train",),
    "sft": ("sft_train",),
    "xtoken_off_policy_distillation": ("xtoken_off_policy_distillation_train",),
}
#: GRPO's single-controller setup (7ea279a), wrapped where it is defined and where the package re-exports it.
SINGLE_CONTROLLER = _ALGORITHMS + "single_controller_utils"
_POLICY_SETUP = "nemo_rl.models.megatron.setup"
_POLICY_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"
#: Where NeMo-RL packs a Megatron micro-batch (>= 0.6.0; 0.5.x: ``nemo_rl.models.megatron.common``),
#: and the parameters the packing functions share (``seq_lengths``: one per sequence packed).
_MEGATRON_DATA = "nemo_rl.models.megatron.data"
_PACKING_PARAMS = ("input_ids", "seq_lengths")
#: The Megatron worker's layouts: ``setup-module`` (>= 0.6.0), ``worker-inline`` (0.5.x).
_SETUP_MODULE, _WORKER_INLINE = "setup-module", "worker-inline"

HOOKS = {
    "nemo_rl_driver": HookSeams(
        "NeMo-RL",
        ("NeMo-RL",),
        (
            *(Seam(_ALGORITHMS + name, "setup", (), "_wrap_setup") for name in _SETUPS),
            *(Seam(_ALGORITHMS + name, f, (), "_wrap_train", OPTIONAL) for name, fs in _TRAIN.items() for f in fs),
            *(
                Seam(module, "setup_single_controller", ("master_config", "tokenizer"), "_wrap_setup")
                for module in (SINGLE_CONTROLLER + ".setup", SINGLE_CONTROLLER)
            ),
            Seam(
                "nemo_rl.utils.logger", "Logger.log_metrics", ("self", "metrics", "step", "prefix"), "_wrap_log_metrics"
            ),
        ),
    ),
    "megatron_worker": HookSeams(
        "NeMo-RL",
        ("NeMo-RL", "megatron-core"),
        (
            Seam(
                _POLICY_SETUP,
                "_apply_performance_config",
                ("model_cfg", "config"),
                "_wrap_performance_config",
                _SETUP_MODULE,
            ),
            Seam(
                _POLICY_WORKER,
                "validate_and_set_config",
                ("config", "rank"),
                "_wrap_validate_and_set_config",
                _SETUP_MODULE,
            ),
            Seam(
                _POLICY_WORKER,
                "setup_model_and_optimizer",
                ("policy_cfg", "megatron_cfg"),
                "_wrap_setup_model_and_optimizer",
                _SETUP_MODULE,
            ),
            Seam(
                _POLICY_WORKER,
                "setup_megatron_model",
                ("policy_cfg", "cfg"),
                "_wrap_setup_megatron_model",
                _WORKER_INLINE,
            ),
        ),
        {_SETUP_MODULE: ">=0.6.0", _WORKER_INLINE: ">=0.5.0,<0.6.0"},
    ),
    "packed_boundaries": HookSeams(
        "NeMo-RL",
        (),
        (
            Seam(_MEGATRON_DATA, "_pack_sequences_for_megatron", _PACKING_PARAMS, "_wrap_pack"),
            Seam(_MEGATRON_DATA, "_prepare_vlm_batch_for_megatron", _PACKING_PARAMS, "_wrap_pack", OPTIONAL),
            Seam(
                "nemo_rl.models.megatron.common",
                "_pack_sequences_for_megatron",
                _PACKING_PARAMS,
                "_wrap_pack",
                OPTIONAL,
            ),
        ),
    ),
    "megatron_generation": HookSeams(
        "NeMo-RL",
        (),
        (
            Seam(
                "nemo_rl.models.generation.megatron.megatron_worker",
                "MegatronGenerationMixin._initialize_inference_engine",
                ("self", "mcore_generation_config"),
                "_wrap_initialize",
            ),
        ),
    ),
    "te_readback": HookSeams(
        "Transformer Engine",
        ("Transformer Engine",),
        (
            Seam(
                "transformer_engine.pytorch.attention.dot_product_attention.utils",
                "get_attention_backend",
                (),
                "_recording",
            ),
        ),
    ),
    "vllm_worker": HookSeams(
        "vLLM",
        ("vLLM",),
        (Seam("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model", (), "_wrap_warm_up"),),
    ),
}
