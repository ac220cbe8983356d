"""Stand-in for ``nemo_rl/models/megatron/data.py`` (NeMo-RL >= 0.6, read at 7ea279a).

``process_microbatch`` packs a micro-batch through the module global ``_pack_sequences_for_megatron``,
whose signature and returns are upstream's (``all_input_ids, packed_input_ids, packed_seq_params,
cu_seqlens, cu_seqlens_padded``; here without padding or context parallelism): one ``[1, T]`` row and
the ``PackedSeqParams`` (``qkv_format="thd"``) its forward must receive.
"""

import itertools

import torch
from megatron.core.packed_seq_params import PackedSeqParams


def process_microbatch(input_ids, seq_lengths):
    _, packed_input_ids, packed_seq_params, _, _ = _pack_sequences_for_megatron(input_ids, seq_lengths)
    return packed_input_ids, packed_seq_params


def _pack_sequences_for_megatron(
    input_ids,
    seq_lengths,
    pad_individual_seqs_to_multiple_of=1,
    pad_packed_seq_to_multiple_of=1,
    pad_packed_seq_to=None,
    cp_rank=0,
    cp_size=1,
):
    lengths = [int(n) for n in seq_lengths]
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    packed = torch.cat([input_ids[b, :n] for b, n in enumerate(lengths)]).unsqueeze(0)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens,
        cu_seqlens_kv_padded=cu_seqlens,
        max_seqlen_q=max(lengths),
        max_seqlen_kv=max(lengths),
    )
    return packed, packed, params, cu_seqlens, cu_seqlens
