"""The mask and softmax the Megatron worker records (``hosts.megatron_behaviour``) are what real
Transformer Engine's ``DotProductAttention`` holds, at every TE version the lane installs (2.20.2
keeps the softmax scale on the module, 2.14.1 only on its kernel modules)."""

from __future__ import annotations

import math

import pytest

from tests.conftest import module_json
from tests.real_te import TE_PATHS

pytestmark = pytest.mark.real_te

#: Per case of ``core_behaviour.CASES``: the mask kind and the softmax kind.
EXPECTED = (
    ({"causal": True, "window": 127}, {"scale": 1 / 8, "softcap": None, "sinks": "learnable"}),
    ({"causal": True, "window": None}, {"scale": 1 / math.sqrt(128), "softcap": None, "sinks": "off-by-one"}),
    ({"causal": True, "window": None}, {"scale": 1 / math.sqrt(128), "softcap": None, "sinks": "none"}),
)


@pytest.mark.parametrize("te_path", [None, *TE_PATHS])
def test_the_mask_and_softmax_are_what_transformer_engines_module_holds(te_path):
    out = module_json("tests.real_te.core_behaviour", first_on_path=te_path)
    for read, (mask, softmax) in zip(out["read"], EXPECTED, strict=True):
        assert read["problems"] == []
        assert read["mask"][:2] == ["observed", {"kinds": [mask], "layers": [[0, 0]]}], out["te"]
        assert read["softmax"][0] == "observed" and read["softmax"][1]["kinds"][0] == pytest.approx(softmax)
        assert read["mask"][2].startswith("TEDotProductAttention.window_size/attn_mask_type (causal) of ")
