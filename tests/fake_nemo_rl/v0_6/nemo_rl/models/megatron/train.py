"""Stand-in for ``nemo_rl/models/megatron/train.py`` (NeMo-RL >= 0.6, read at 7ea279a): ``model_forward``
hands the micro-batch's ``PackedSeqParams`` to the model as ``packed_seq_params=`` (upstream l.162-163).
"""

#: False stands in for upstream; True for a host that drops them on the way to the model (the class
#: of NeMo-RL #2105 / #4167), which the plugin names ``PACKED_BOUNDARIES_DROPPED``.
DROPS_PACKED_SEQ_PARAMS = False


def model_forward(model, data_dict, input_ids_cp_sharded, position_ids, attention_mask, packed_seq_params=None):
    additional_kwargs = {}
    if packed_seq_params is not None and not DROPS_PACKED_SEQ_PARAMS:
        additional_kwargs["packed_seq_params"] = packed_seq_params
    return model(
        input_ids=input_ids_cp_sharded, position_ids=position_ids, attention_mask=attention_mask, **additional_kwargs
    )
