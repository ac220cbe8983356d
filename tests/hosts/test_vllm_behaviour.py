"""The vLLM behaviour reader (``hosts.vllm_behaviour``) and its place in the rollout hook, in the base
lane: layers that show less than the reader needs, readers that fail, the live module left as it was.
vLLM's real modules are read in tests/real_vllm/test_behaviour.py (lane vllm); here its
``RotaryEmbedding`` and ``Attention`` are small stand-ins with vLLM's attribute and method names."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_attn_align.binding.behaviour_difference import difference
from nemo_rl_attn_align.hosts import vllm_behaviour
from nemo_rl_attn_align.hosts.vllm_behaviour import read_behaviour
from nemo_rl_attn_align.report.store import read_worker_files
from nemo_rl_attn_align.vocab.behaviour import BEHAVIOUR_FIELDS, layer_kinds
from tests.behaviour_samples import default_rates, rope_kind, rope_value
from tests.hosts.test_vllm_worker import fake_vllm  # noqa: F401 (fixture)


class RotaryEmbedding(torch.nn.Module):
    """Stand-in for vLLM's ``RotaryEmbedding`` (``rotary_embedding/base.py``): NeoX pairs over the first
    ``rotary_dim`` channels, a bf16 ``cos_sin_cache`` buffer of ``max_position_embeddings`` rows."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float):
        super().__init__()
        self.head_size, self.rotary_dim, self.base = head_size, rotary_dim, base
        self.max_position_embeddings = max_position_embeddings
        self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache().to(torch.bfloat16), persistent=False)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = 1.0 / self.base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim)
        freqs = torch.outer(torch.arange(self.max_position_embeddings, dtype=torch.float), inv_freq)
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def forward_native(self, positions, query, key=None):
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        x = query.view(positions.shape[0], -1, self.head_size)
        x1, x2 = x[..., : self.rotary_dim // 2], x[..., self.rotary_dim // 2 : self.rotary_dim]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., self.rotary_dim :]), dim=-1)
        return rotated.reshape(query.shape), key


class Attention:
    """Stand-in for vLLM's ``Attention`` layer (``is_attention_module`` goes by the class name)."""

    def __init__(self, window=(-1, -1), soft_cap=0, sinks=None, attn_type="decoder", scale=0.125):
        self.head_size, self.attn_type = 32, attn_type
        self.impl = SimpleNamespace(scale=scale, sliding_window=window, logits_soft_cap=soft_cap, sinks=sinks)


def engine(layers: list[Attention], rotary=None, **holder) -> tuple[dict, dict]:
    """(static_forward_context, modules) of a model whose layers hold ``layers``; every holder shares
    ``rotary`` (a default RoPE over 32 channels, 512 positions, unless given) as get_rope shares one."""
    rotary = RotaryEmbedding(32, 32, 512, 10000.0) if rotary is None else rotary
    context = {f"model.layers.{i}.self_attn.attn": layer for i, layer in enumerate(layers)}
    modules = {
        f"model.layers.{i}.self_attn": SimpleNamespace(**{"rotary_emb": rotary, **holder}) for i in range(len(layers))
    }
    return context, modules


def test_rope_mask_and_softmax_of_each_layer():
    layers = [Attention(window=(63, 0), soft_cap=50.0), Attention(window=64, sinks=torch.zeros(4)), Attention()]
    fields, problems = read_behaviour(*engine(layers))
    assert problems == [] and {name: fields[name].provenance.value for name in BEHAVIOUR_FIELDS} == dict.fromkeys(
        BEHAVIOUR_FIELDS, "observed"
    )
    rope = fields["rope"].value
    assert rope["positions"] == [1, 61] and rope["layers"] == [[0, 0], [1, 0], [2, 0]]
    expected = rope_value(dict.fromkeys(range(3), rope_kind(default_rates(32, 10000.0), 32)))
    assert difference("rope", expected, rope) is None
    assert "positions 4093, 131071 not evaluated: past the 512 positions" in fields["rope"].source
    windows = [kind["window"] for kind in layer_kinds(fields["mask"].value).values()]
    assert windows == [63, 63, None]  # (W-1, 0) pair, CPU_ATTN's int W, (-1, -1)
    softmax = list(layer_kinds(fields["softmax"].value).values())
    assert [(k["softcap"], k["sinks"]) for k in softmax] == [(50.0, "none"), (None, "learnable"), (None, "none")]


def test_partial_rotary_leaves_the_other_channels_alone_and_the_live_module_untouched():
    rotary = RotaryEmbedding(32, 16, 131072, 10000.0)
    held = rotary.cos_sin_cache
    fields, _ = read_behaviour(*engine([Attention()], rotary))
    [kind] = fields["rope"].value["kinds"]
    assert kind["pairs"] == [[i, i + 8] for i in range(8)] and kind["head_dim"] == 32
    assert fields["rope"].value["positions"] == [1, 61, 4093, 131071]
    assert rotary.cos_sin_cache is held and held.dtype == torch.bfloat16


def test_a_layer_without_rotary_embedding_has_no_pairs():
    fields, _ = read_behaviour(*engine([Attention()], rotary=SimpleNamespace(), rotary_emb=None))
    assert fields["rope"].value["kinds"] == [{"head_dim": 32, "pairs": [], "angles": [[]] * 4, "scales": []}]


def test_what_a_layer_does_not_show_is_unobservable_with_the_reason():
    context, modules = engine([Attention(attn_type="cross"), Attention()])
    del modules["model.layers.1.self_attn"].rotary_emb
    fields, problems = read_behaviour(context, modules)
    assert problems == []
    assert fields["rope"].provenance.value == "unobservable"
    assert "SimpleNamespace holding model.layers.1.self_attn.attn has no rotary_emb" in fields["rope"].source
    assert "attn_type 'cross'" in fields["mask"].source and fields["mask"].provenance.value == "unobservable"
    assert fields["softmax"].provenance.value == "observed"
    fields, _ = read_behaviour(*engine([Attention(attn_type="encoder_only")]))
    assert fields["mask"].value["kinds"] == [{"causal": False, "window": None}]


def test_a_map_that_is_not_a_rotation_of_pairs_is_unobservable_with_the_reason():
    class Cyclic(RotaryEmbedding):  # channels 0 -> 1 -> 2 -> 0: no pair rotates alone
        def forward_native(self, positions, query, key=None):
            heads = query.view(positions.shape[0], -1, self.head_size)
            return torch.cat((heads[..., 2:3], heads[..., :2], heads[..., 3:]), dim=-1).reshape(query.shape), key

    fields, problems = read_behaviour(*engine([Attention()], Cyclic(32, 32, 512, 10000.0)))
    assert problems == [] and fields["rope"].provenance.value == "unobservable"
    assert fields["rope"].source.startswith("not read from the engine's modules: channel 0 moves into 1")


def test_a_reader_that_fails_is_a_problem_to_note_and_the_other_fields_are_still_read():
    class Broken(RotaryEmbedding):
        def forward_native(self, positions, query, key=None):
            raise RuntimeError("no kernel for this")

    fields, problems = read_behaviour(*engine([Attention()], Broken(32, 32, 512, 10000.0)))
    assert problems == ["reading the attention rope from the engine's modules failed: RuntimeError: no kernel for this"]
    assert fields["rope"].provenance.value == "unobservable" and fields["rope"].source == problems[0]
    assert fields["mask"].provenance.value == fields["softmax"].provenance.value == "observed"


def test_the_hook_records_the_engines_behaviour_and_survives_a_reader_that_raises(fake_vllm, tmp_path, monkeypatch):  # noqa: F811
    worker = fake_vllm.Worker(fake_vllm.standin_vllm_config())
    worker.compile_or_warm_up_model()
    [record] = read_worker_files(tmp_path).records
    rope = record.contract["rope"]  # the stand-in worker's layers are no vLLM Attention modules
    assert (rope.provenance.value, rope.source) == (
        "unobservable",
        "no softmax attention layer in static_forward_context",
    )

    def raises(*args):
        raise ImportError("torch is not installed")

    monkeypatch.setattr(vllm_behaviour, "read_behaviour", raises)
    assert fake_vllm.Worker(fake_vllm.standin_vllm_config()).compile_or_warm_up_model() == 0.0
    detail = json.loads((tmp_path / "hosts" / "rollout--vllm-rank3-worker0-engine1.json").read_text())
    why = "the attention behaviour (rope, mask, softmax) was not read: ImportError: torch is not installed"
    assert detail["findings"] == [why]
    contract = read_worker_files(tmp_path).records[1].contract
    assert {(contract[name].provenance.value, contract[name].source) for name in BEHAVIOUR_FIELDS} == {
        ("unobservable", why)
    }


@pytest.mark.parametrize("window, expected", [((4095, 0), 4095), (4096, 4095), (-1, None), (None, None)])
def test_windows_as_the_kernel_receives_them(window, expected):
    fields, _ = read_behaviour(*engine([Attention(window=window)]))
    assert fields["mask"].value["kinds"] == [{"causal": True, "window": expected}]
