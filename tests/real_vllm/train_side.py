"""The training side of one tiny model, as a user's NeMo-RL run builds it: ``python train_side.py SPEC_JSON``.

A real megatron-core ``GPTModel`` on CPU, built by the stand-in NeMo-RL >= 0.6 policy worker
(``tests/fake_nemo_rl``: NeMo-RL is not on PyPI) through the plugin's training hook, which the
installed ``.pth`` attaches at interpreter start; one forward so the hook reads back the backend.
``SPEC_JSON``: ``{"paths": [...] for sys.path, "model": {TransformerConfig overrides}, "tokenizer": dir}``.
"""

import json
import sys


def transformer_config(hf: dict) -> dict:
    """The ``model`` of a spec: the TransformerConfig of the model whose ``config.json`` is ``hf``
    (``tests/gpu/cases.megatron_model_from_hf``), its RoPE base an integer, at 64 tokens."""
    from tests.gpu.cases import megatron_model_from_hf

    model = megatron_model_from_hf(hf)
    return {**model, "rotary_base": int(model.get("rotary_base", 10000)), "seq_length": 64}


def main() -> None:
    spec = json.loads(sys.argv[1])
    sys.path[:0] = spec["paths"]
    from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorker

    from tests.fake_nemo_rl.configs import policy_config

    config = policy_config(
        "local", model_name=spec["tokenizer"], tokenizer={"name": spec["tokenizer"]}, standin_model=spec["model"]
    )
    MegatronPolicyWorker(config).get_logprobs()
    print("TRAIN_SIDE_DONE", flush=True)


if __name__ == "__main__":
    main()
