"""The plugin's loader gives what NeMo-RL's own loader gives, on every YAML of every snapshot.

NeMo-RL's path (each ref's own ``nemo_rl/utils/config.py``): ``load_config`` then
``parse_hydra_overrides`` then ``OmegaConf.to_container(resolve=True)``, as ``examples/run_*.py``
do. Ours: ``nemo_rl_attn_align.config.loader.load_config(path, overrides)``, which is ``finish_config(
compose_config(path), overrides)``. For each YAML the overrides are built from the file's own keys:
none; one list that applies a set, a ``++`` add of a new key, a ``++`` on an existing key, a ``~``
delete and a ``${...}`` in a value; and three that must fail in both (a missing key without
``++``, ``+`` on an existing key, ``~`` of a missing key). Equal means: the same resolved dict, or
both raise.

Speed (about 760 YAMLs x 5 variants x 2 loaders): each side composes a file once (NeMo-RL's
``load_config``, our ``compose_config``) and every variant runs on a deep copy of that; and a
YAML file is parsed once for both sides (``OmegaConf.load`` cached per path: same text, same parse,
a fresh ``DictConfig`` each call). Inheritance, merges, overrides and resolution all run per call.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nemo_rl_attn_align.config.loader import compose_config, finish_config, register_nemo_rl_resolvers

from .conftest import REFS, load_source_module, snapshot

pytestmark = pytest.mark.real_nemo_rl

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scalar_leaves(node, prefix=()):
    """Dotted paths of scalar, non-interpolated leaves whose keys Hydra's grammar accepts."""
    from omegaconf import DictConfig, OmegaConf

    for key in node.keys():
        if not isinstance(key, str) or not _KEY.match(key):
            continue
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            yield from _scalar_leaves(value, (*prefix, key))
        elif not OmegaConf.is_config(value) and isinstance(value._value(), (int, float, str, bool)):
            yield ".".join((*prefix, key))


def override_variants(cfg) -> dict[str, list[str]]:
    """Override lists for one composed (unresolved) config, built from its own keys: one list that
    must apply (set, ``++`` add, ``++`` on an existing key, ``~`` delete, ``${...}`` in a value, on
    different leaves where the file has enough) and three that must fail."""
    leaves = list(_scalar_leaves(cfg))
    applies = ["++attn_align_probe.added=[1,2]"]
    if leaves:
        last, first = leaves[-1], leaves[0]
        applies.append(f"{last}=${{{first}}}" if last != first else f"{last}=7")
    if len(leaves) >= 3:
        applies += [f"{leaves[1]}=7", f"++{leaves[2]}=true"]
    if len(leaves) >= 4:
        applies.append(f"~{leaves[3]}")
    variants = {
        "none": [],
        "set, ++ add, ~ delete, ${...}": applies,
        "missing key without ++ (must fail)": ["attn_align_probe_missing.key=1"],
        "delete a missing key (must fail)": ["~attn_align_probe_missing"],
    }
    if leaves:
        variants["+ on an existing key (must fail)"] = [f"+{leaves[-1]}=9"]
    return variants


def _outcome(load):
    try:
        return ("ok", load())
    except Exception as err:
        return ("error", type(err).__name__)


@pytest.fixture
def parse_once(monkeypatch):
    """``OmegaConf.load`` with the YAML parse of each path kept (a fresh ``DictConfig`` per call)."""
    import copy
    import os

    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    parsed: dict[str, object] = {}
    original = OmegaConf.load

    def load(file_):
        if not isinstance(file_, (str, Path)):
            return original(file_)
        key = os.path.abspath(file_)
        if key not in parsed:
            with open(key, encoding="utf-8") as handle:
                parsed[key] = yaml.load(handle, Loader=get_yaml_loader())
        obj = copy.deepcopy(parsed[key])
        return OmegaConf.create() if obj is None else OmegaConf.create(obj)

    monkeypatch.setattr(OmegaConf, "load", staticmethod(load))


@pytest.mark.parametrize("ref", REFS)
def test_loader_equals_nemo_rl_on_every_yaml(ref, parse_once, capsys):
    import copy

    from omegaconf import OmegaConf

    tree = snapshot(ref)
    nemo_config = load_source_module(tree, "nemo_rl/utils/config.py", f"nemo_rl_config_{ref.replace('.', '_')}")
    register_nemo_rl_resolvers()  # the same four resolvers every ref's recipes register
    yamls = sorted((tree / "examples" / "configs").rglob("*.yaml"))
    assert yamls, f"no YAML under {tree}/examples/configs"

    def theirs(composed, overrides: list[str]):
        cfg = copy.deepcopy(composed)
        if overrides:
            cfg = nemo_config.parse_hydra_overrides(cfg, overrides)
        return OmegaConf.to_container(cfg, resolve=True)

    loads, differences, both_failed = 0, [], 0

    def compare(where: str, overrides: list[str], expected, got) -> None:
        nonlocal loads, both_failed
        loads += 1
        if expected[0] != got[0] or (expected[0] == "ok" and expected[1] != got[1]):
            differences.append(
                f"{where} {overrides}: NeMo-RL {expected[0]} {expected[1] if expected[0] == 'error' else ''}, "
                f"ours {got[0]} {got[1] if got[0] == 'error' else ''}"
            )
        elif expected[0] == "error":
            both_failed += 1

    for path in yamls:
        where = str(path.relative_to(tree))
        composed = _outcome(lambda path=path: nemo_config.load_config(path))
        ours = _outcome(lambda path=path: compose_config(path))
        if composed[0] == "error" or ours[0] == "error":
            compare(f"{where} [compose]", [], composed, ours)
            continue
        for name, overrides in override_variants(composed[1]).items():
            expected = _outcome(lambda composed=composed, overrides=overrides: theirs(composed[1], overrides))
            compare(
                f"{where} [{name}]",
                overrides,
                expected,
                _outcome(lambda ours=ours, overrides=overrides: finish_config(copy.deepcopy(ours[1]), overrides)),
            )
            if name.endswith("(must fail)"):
                assert expected[0] == "error", f"{where} {overrides}: NeMo-RL accepted an override that must fail"
    with capsys.disabled():
        print(
            f"\nloader equivalence {ref}: {len(yamls)} YAMLs, {loads} loads, {both_failed} failed in both, "
            f"{len(differences)} differences"
        )
    assert not differences, "\n".join(differences[:20])


#: Hand-made files on which the plugin's loader once differed from NeMo-RL's (7ea279a): a child's
#: top-level ``${...}`` naming a key only its parent defines, and a top-level value interpolating a
#: section that carries ``_override_`` (before and after it).
EDGE_CASES = {
    "parent key from child": {"parent.yaml": "a: 3\nb: 4\n", "child.yaml": "defaults: parent.yaml\nc: ${a}\n"},
    "resolver over parent key": {
        "parent.yaml": "a: 3\nb: 4\n",
        "child.yaml": "defaults: parent.yaml\nc: ${mul:2,${b}}\n",
    },
    "interpolated _override_ section first": {
        "parent.yaml": "a: {v: 0, z: 9}\nc: {q: 1}\n",
        "child.yaml": "defaults: parent.yaml\nc: ${a}\na: {_override_: true, w: 1}\n",
    },
    "_override_ section then its interpolation": {
        "parent.yaml": "a: {v: 0, z: 9}\nc: {q: 1}\n",
        "child.yaml": "defaults: parent.yaml\na: {_override_: true, w: 1}\nc: ${a}\n",
    },
    "nested interpolation of a parent key": {
        "parent.yaml": "a: 3\n",
        "child.yaml": "defaults: parent.yaml\nsec: {c: '${a}'}\n",
    },
    "mandatory value filled by the child": {"parent.yaml": "a: ???\n", "child.yaml": "defaults: parent.yaml\na: 5\n"},
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_loader_edge_cases_equal_nemo_rl(case, tmp_path):
    from omegaconf import OmegaConf

    nemo_config = load_source_module(snapshot("7ea279a"), "nemo_rl/utils/config.py", "nemo_rl_config_7ea279a")
    register_nemo_rl_resolvers()
    for name, text in EDGE_CASES[case].items():
        (tmp_path / name).write_text(text)
    child = tmp_path / "child.yaml"
    expected = _outcome(lambda: OmegaConf.to_container(nemo_config.load_config(child), resolve=True))
    got = _outcome(lambda: finish_config(compose_config(child)))
    assert got[0] == expected[0] and (got[0] == "error" or got[1] == expected[1]), (expected, got)
