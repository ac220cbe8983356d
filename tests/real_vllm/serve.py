"""Start one real vLLM engine and generate, as a user's script would: ``python serve.py SPEC_JSON``.

It never imports the plugin: the record must come from the ``vllm.general_plugins`` entry point
and the hook alone. ``SPEC_JSON``: ``{"model": dir, "engine": {LLM kwargs}, "prompt": [token ids] or
null}`` (null: start the engine only; vLLM's batch-invariant kernels are Triton, which cannot run on
CPU, but the engine starts and warms up). Prints one line ``SERVE_RESULT {json}``: this process's
pid and the generated token ids. With ``ATTN_ALIGN_TEST_REVERT`` set, the upstream fix it names is
taken back out of vLLM in this process first (``reverts.py``).
"""

import json
import os
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    from reverts import REVERT_ENV, REVERTS  # beside this script

    if os.environ.get(REVERT_ENV):
        REVERTS[os.environ[REVERT_ENV]]()
    import vllm

    llm = vllm.LLM(model=spec["model"], **spec["engine"])
    tokens = None
    if spec["prompt"] is not None:
        params = vllm.SamplingParams(max_tokens=4, temperature=0.0)
        out = llm.generate([vllm.TokensPrompt(prompt_token_ids=spec["prompt"])], params)
        tokens = list(out[0].outputs[0].token_ids)
    print("SERVE_RESULT " + json.dumps({"pid": os.getpid(), "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
