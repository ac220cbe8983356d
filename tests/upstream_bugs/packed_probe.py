"""NeMo-RL's own packing and forward step on one packed micro-batch, with the plugin active.

``python -m tests.upstream_bugs.packed_probe TREE {fixed,dropped,truncated}`` prints one JSON line.

Run by ``test_packed_sequences.py`` in a process of its own, with the plugin's checkout and the
stand-ins on the path (``TREE``, a NeMo-RL source tree, goes after them: it has a ``tests`` package
of its own) and the plugin activated by its ``.pth``. It records facts only; the tests judge them.

``dropped`` re-introduces the upstream bug at import, in this process only: ``nemo_rl.models.megatron.train``
is compiled from the tree's own source with the one statement that hands the packed boundaries to
the model (``additional_kwargs["packed_seq_params"] = packed_seq_params`` in ``model_forward``) taken
out, as NeMo-RL #2105 / #4167 lose them on the DTensor path; nothing on disk changes. ``truncated``
re-introduces Megatron-Bridge #4400 the same way: that statement hands the model what the installed
Megatron-Bridge's own ``get_packed_seq_params`` makes of NeMo-RL's boundaries in the legacy layout
its Nemotron Omni encoder gave before the fix (``cu_seqlens`` with its ``cu_seqlens_argmin``,
``cu_seqlens_unpadded`` without ``cu_seqlens_unpadded_argmin``: Megatron-Bridge 0.6.2 still cuts
those at their argmin, 0 where no -1 sentinel follows, to nothing).

The model is a tiny megatron-core GPTModel on CPU (``cpu_megatron.build_gpt(..., packed=True)``: its
attention layers megatron-core's, its core attention the CPU stand-in for Transformer Engine's), given
to the Megatron worker hook as NeMo-RL's ``setup_model_and_optimizer`` returns it to the hook's
wrapper (``megatron_worker._after_model_built``), for a policy that packs. Then NeMo-RL's own code:
``process_microbatch`` (which calls ``_pack_sequences_for_megatron``) on ``LENGTHS`` sequences, and
``forward_with_post_processing_fn`` (-> ``model_forward``) with ``LogprobsPostProcessor``, whose
function then makes the token logprobs, as megatron-core's schedule calls them (the schedule itself,
``megatron_forward_backward``, does not run on CPU: megatron-core 0.19.2's
``forward_backward_no_pipelining`` makes a tensor on ``"cuda"``). Each sequence also runs alone
through the model, unpacked: the token logprobs of both are recorded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The statement the upstream fix is, in ``nemo_rl/models/megatron/train.py`` (7ea279a l.163).
FIX = 'additional_kwargs["packed_seq_params"] = packed_seq_params'
TRAIN = "nemo_rl.models.megatron.train"
#: The lengths of the sequences the micro-batch packs.
LENGTHS = (5, 3, 4)


#: What ``FIX`` becomes per case: the boundaries dropped, or made by Megatron-Bridge as before #4400.
BUGS = {
    "dropped": "pass",
    "truncated": FIX.replace("= packed_seq_params", "= __import__('tests.upstream_bugs.packed_probe').upstream_bugs"
                             ".packed_probe.megatron_bridge_4400(packed_seq_params)"),
}  # fmt: skip


def megatron_bridge_4400(params):
    """NeMo-RL's ``params`` through the installed Megatron-Bridge's ``get_packed_seq_params``, in the
    layout its Nemotron Omni encoder gave before #4400 (no ``cu_seqlens_unpadded_argmin``)."""
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    padded = params.cu_seqlens_q_padded
    legacy = {
        "cu_seqlens": padded,
        "cu_seqlens_argmin": padded.new_tensor(len(padded)),
        "cu_seqlens_unpadded": params.cu_seqlens_q,
        "max_seqlen": params.max_seqlen_q,
    }
    return get_packed_seq_params(legacy)


class _WithoutFix(importlib.machinery.SourceFileLoader):
    """Compiles the module from its source with ``FIX`` replaced by ``bug`` (no bytecode cache)."""

    def __init__(self, fullname, path, bug):
        super().__init__(fullname, path)
        self.bug = bug

    def get_code(self, fullname):
        source = Path(self.path).read_text()
        if source.count(FIX) != 1:
            raise RuntimeError(f"{self.path} has {source.count(FIX)} lines {FIX!r}; expected 1")
        return compile(source.replace(FIX, self.bug), self.path, "exec", dont_inherit=True)


class _BugFinder(importlib.abc.MetaPathFinder):
    def __init__(self, bug: str):
        self.bug = bug

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRAIN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        spec.loader = _WithoutFix(fullname, spec.origin, self.bug)
        return spec


def _token_logprobs(logits, tokens):
    """Each next token's logprob under ``logits`` ``[1, S, V]`` for ``tokens`` ``[S]``."""
    return logits[0, :-1].float().log_softmax(-1).gather(-1, tokens[1:, None])[:, 0]


def report(report_dir: Path) -> dict[str, Any]:
    """``nemo-rl-attn-align report`` on the report folder, as a user runs it: exit code, text, verdict, findings."""
    command = [sys.executable, "-m", "nemo_rl_attn_align", "report", str(report_dir)]
    text = subprocess.run(command, capture_output=True, text=True, timeout=300)
    doc = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300).stdout)
    return {"exit_code": text.returncode, "text": text.stdout, "verdict": doc["verdict"], "findings": doc["findings"]}


def run(report_dir: Path) -> dict[str, Any]:
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl.models.megatron import data, train

    from nemo_rl_attn_align.hosts import megatron_worker
    from nemo_rl_attn_align.probe.megatron_side import cpu_only
    from nemo_rl_attn_align.report.store import read_worker_files
    from nemo_rl_attn_align.vocab.patching import is_wrapped
    from tests.fake_nemo_rl.cpu_megatron import TINY_MODEL, StandInGPTProvider, build_gpt

    os.environ["NEMO_RL_ATTN_ALIGN_REPORT_DIR"] = str(report_dir)
    policy = {"sequence_packing": {"enabled": True}, "logprob_chunk_size": None}
    model = build_gpt(StandInGPTProvider(**TINY_MODEL, use_cpu_initialization=True), packed=True).eval()
    megatron_worker.record.policy_cfg = policy
    megatron_worker._after_model_built([model])
    seam_wrapped = is_wrapped(data._pack_sequences_for_megatron)

    torch.manual_seed(1)
    ids = torch.randint(1, model.vocab_size, (len(LENGTHS), max(LENGTHS)))
    batch = BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor(LENGTHS)})
    processed = data.process_microbatch(batch, seq_length_key="input_lengths", pack_sequences=True)
    microbatch = data.ProcessedMicrobatch(data_dict=batch, **vars(processed))
    with cpu_only(), torch.no_grad():
        logits, post_process = train.forward_with_post_processing_fn(
            iter([microbatch]), model, post_processing_fn=train.LogprobsPostProcessor(cfg=policy)
        )
        _, out = post_process(logits)
        alone = [
            _token_logprobs(model(ids[b : b + 1, :n], torch.arange(n)[None], None), ids[b, :n]).tolist()
            for b, n in enumerate(LENGTHS)
        ]
    packed = [out["logprobs"][b, 1:n].tolist() for b, n in enumerate(LENGTHS)]  # NeMo-RL's: 0 at token 0
    detail = next(iter(read_worker_files(report_dir).details.values())).to_dict()
    return {
        "seam_wrapped_before": seam_wrapped,
        "seam_wrapped_after": is_wrapped(data._pack_sequences_for_megatron),
        "hooks_left": [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks],
        "fix_in_source": FIX in Path(train.__file__).read_text(),
        "train_file": train.__file__,
        "detail": detail,
        "report": report(report_dir),
        "packed_logprobs": packed,
        "alone_logprobs": alone,
    }


def main(tree: str, case: str) -> None:
    sys.path.append(tree)
    from nemo_rl_attn_align.probe.bridge_side import import_bridge

    import_bridge()  # megatron-core first (its own attention, not the stand-in's), then TE's stand-in
    import attn_align_stand_ins  # noqa: F401 - the names megatron-core 0.19.2 lacks

    if case in BUGS:
        sys.meta_path.insert(0, _BugFinder(BUGS[case]))
    with tempfile.TemporaryDirectory() as report_dir:
        result = run(Path(report_dir))
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
