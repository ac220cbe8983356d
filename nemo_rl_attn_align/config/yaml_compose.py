"""Compose one YAML text as ``OmegaConf.load`` does, within the limits of ``limits``, and fast.

NeMo-RL reads its recipes with ``OmegaConf.load``: PyYAML's pure-Python scanner and parser under
OmegaConf's loader class (duplicate keys rejected, YAML 1.1 floats, no timestamps). ``compose_yaml``
builds the same objects with PyYAML's composer and constructor under the same rules
(``_omegaconf_rules``, public API only). Where PyYAML has libyaml
it takes the parser events from libyaml instead (``yaml.cyaml.CParser``), which is several times
faster, but only for text made of printable ASCII and newlines, where the two parsers agree (the
tests compare them over every shipped example, NeMo-RL's recipes and generated YAML; ``!`` tags, ``?``
and a block scalar's header followed by a comment are left to Python, where they differ). Any
failure on that path is retried on the pure-Python path, so an error always reads as in NeMo-RL.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from nemo_rl_attn_align.vocab.limits import MAX_CONFIG_NODES, MAX_NESTING

#: Text the libyaml path is not trusted with: not printable ASCII, a tag, ``?``, ``|#`` (found by fuzzing).
_LEFT_TO_PYTHON = re.compile(r"[^\x20-\x7e\n]|[!?]|[|>][-+0-9]*#")


class OverLimit(Exception):
    """Raised while composing when a limit is crossed (the loader turns it into a UsageError)."""


class _BoundedComposition:
    """Counts composed nodes (each alias use counts one) and nesting; stops as soon as either limit
    is crossed, before the document is built."""

    composed = 0
    depth = 0

    def compose_node(self, parent, index):
        self.composed += 1
        self.depth += 1
        try:
            if self.composed > MAX_CONFIG_NODES:
                raise OverLimit(f"the YAML (with its defaults chain) has more than {MAX_CONFIG_NODES} values")
            if self.depth > MAX_NESTING + 1:
                raise OverLimit(f"the YAML nests deeper than {MAX_NESTING} levels")
            return super().compose_node(parent, index)  # type: ignore[misc]  # the Composer's, further along the MRO
        finally:
            self.depth -= 1


#: A float as ``OmegaConf.load`` reads one: YAML 1.1's spellings and YAML 1.2's exponent without a
#: dot (``1e3``, ``1_000e-2``), ``.inf`` and ``.nan``.
_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def _omegaconf_rules() -> type:
    """A PyYAML ``SafeLoader`` with ``OmegaConf.load``'s rules, from PyYAML's public API (OmegaConf
    makes its loader at run time behind a private name that moved in 2.4): a key twice in one
    mapping is an error, ``_FLOAT`` is a float, a timestamp stays a string, OmegaConf's ``pathlib``
    tags make paths. ``tests/config/test_yaml_compose.py`` compares it with ``OmegaConf.load``."""
    import pathlib

    import yaml

    class OmegaConfRules(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            keys: set[str] = set()
            for key_node, _ in node.value:
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value}",
                        key_node.start_mark,
                    )
                keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    OmegaConfRules.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    OmegaConfRules.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in OmegaConfRules.yaml_implicit_resolvers.items()
    }
    for name in ("Path", "PosixPath", "WindowsPath"):
        kind = getattr(pathlib, name)
        OmegaConfRules.add_constructor(
            f"tag:yaml.org,2002:python/object/apply:pathlib.{name}",
            lambda loader, node, kind=kind: kind(*loader.construct_sequence(node)),
        )
    return OmegaConfRules


@functools.cache
def _loader_classes() -> tuple[type, type | None]:
    """OmegaConf's rules made bounded, and their libyaml variant (None without libyaml)."""
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    omegaconf_loader = _omegaconf_rules()
    python_loader = type("BoundedOmegaConfLoader", (_BoundedComposition, omegaconf_loader), {})
    try:
        from yaml.cyaml import CParser
    except ImportError:  # PyYAML built without libyaml
        return python_loader, None

    def __init__(self, stream):
        CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)

    libyaml_loader = type(
        "BoundedOmegaConfCLoader",
        (_BoundedComposition, CParser, omegaconf_loader),
        {
            "__init__": __init__,  # libyaml's events, PyYAML's Python composer (bounded) and constructor
            "get_single_node": Composer.get_single_node,
            "compose_document": Composer.compose_document,
        },
    )
    return python_loader, libyaml_loader


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_size(root, already: int) -> int:
    """How many values building the composed node graph ``root`` makes (an alias counts its whole
    anchor at every use); iterative, linear in the graph's size, stops past ``MAX_CONFIG_NODES``.
    ``OverLimit`` also for an alias that refers to its own anchor."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            sizes[key] = 1 + sum(sizes[id(kid)] for kid in _children(node))
            active.discard(key)
            if already + sizes[key] > MAX_CONFIG_NODES:
                raise OverLimit(
                    f"the YAML expands to more than {MAX_CONFIG_NODES} values (aliases counted at every use)"
                )
            continue
        if key in sizes:
            continue
        if key in active:
            raise OverLimit("a YAML alias refers to its own anchor")
        active.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in sizes)
    return sizes[id(root)]


def _compose_with(loader_class: type, text: str, already: int) -> tuple[Any, int]:
    loader = loader_class(text)
    loader.composed = already
    try:
        node = loader.get_single_node()  # what yaml.load does, with the graph checked before building
        if node is None:
            return None, already
        nodes = already + _expanded_size(node, already)
        return loader.construct_document(node), nodes
    finally:
        loader.dispose()


def compose_yaml(text: str, already: int = 0, *, use_libyaml: bool = True) -> tuple[Any, int]:
    """The Python object of one YAML document (None when empty) and the running node count, given
    ``already`` nodes composed before it. Raises PyYAML's ``YAMLError`` exactly as ``OmegaConf.load``
    would (or another error of its constructor, e.g. ValueError for ``0x``), and ``OverLimit`` past
    ``MAX_CONFIG_NODES`` values or ``MAX_NESTING`` levels."""
    python_loader, libyaml_loader = _loader_classes()
    if use_libyaml and libyaml_loader is not None and not _LEFT_TO_PYTHON.search(text):
        try:
            return _compose_with(libyaml_loader, text, already)
        except Exception:  # a YAML or constructor error, a limit: the pure-Python path decides
            pass  # it raises the error as NeMo-RL shows it
    return _compose_with(python_loader, text, already)
