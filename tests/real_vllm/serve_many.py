"""Start several real vLLM engines one after another in one process, as a user's script would:
``python serve_many.py SPEC_JSON``.

Like ``serve.py`` it never imports the plugin (the records come from the ``vllm.general_plugins``
entry point). ``SPEC_JSON``: ``{"engines": [{"model": dir, "engine": {LLM kwargs}}, ...], "prompt":
[token ids]}``. Each engine generates, then is shut down and dropped before the next starts. Prints
one line ``SERVE_RESULT {json}``: this process's pid and each engine's generated token ids.
"""

import gc
import json
import os
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    import vllm

    tokens = []
    for engine in spec["engines"]:
        llm = vllm.LLM(model=engine["model"], **engine["engine"])
        params = vllm.SamplingParams(max_tokens=4, temperature=0.0)
        out = llm.generate([vllm.TokensPrompt(prompt_token_ids=spec["prompt"])], params)
        tokens.append(list(out[0].outputs[0].token_ids))
        llm.llm_engine.engine_core.shutdown()
        del llm, out
        gc.collect()
    print("SERVE_RESULT " + json.dumps({"pid": os.getpid(), "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
