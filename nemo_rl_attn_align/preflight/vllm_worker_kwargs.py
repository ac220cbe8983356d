"""The engine arguments NeMo-RL's vLLM worker passes to vLLM itself, by NeMo-RL ref (stdlib only).

``BaseVllmGenerationWorker._load_model`` builds ``dict(model=..., dtype=..., seed=..., ...,
**vllm_kwargs)`` (``nemo_rl/models/generation/vllm/vllm_worker.py``), so a
``policy.generation.vllm_kwargs`` key it also passes raises TypeError at worker start, after the
cluster is up. The keys differ by ref; ``tables/vllm_worker_kwargs.json`` holds each ref's, read
from its source by ``scripts/update_vllm_worker_kwargs.py`` (the nemo_rl lane regenerates it and
fails while it differs): per ref its NeMo-RL version and each key with the ``policy.generation``
key NeMo-RL takes it from (None where NeMo-RL computes it). ``reserved_keys`` picks the refs of the
installed NeMo-RL's version, else main's.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, NamedTuple

from nemo_rl_attn_align.vocab import jsonio

TABLE = Path(__file__).with_name("tables") / "vllm_worker_kwargs.json"


class Reserved(NamedTuple):
    """The keys NeMo-RL passes itself (key -> the ``policy.generation`` key it is taken from, or
    None) and which NeMo-RL they were read for, in words."""

    keys: dict[str, str | None]
    which: str


@functools.cache
def table() -> dict[str, Any]:
    """The committed table: ``{"main": REF, "refs": {REF: {"version": V, "keys": {...}}}}``."""
    return jsonio.loads(TABLE.read_text(encoding="utf-8"), str(TABLE))


def _release(version: str) -> tuple[int, ...]:
    """``0.5.0rc0`` -> ``(0, 5, 0)``: a pre-release or local build counts as its release."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    numbers = [int(part) for part in match.group(0).split(".")] if match else []
    return tuple([*numbers, 0, 0, 0][:3])


def reserved_keys(nemo_rl_version: str | None) -> Reserved:
    """What the vLLM worker of NeMo-RL ``nemo_rl_version`` passes itself: the union over the refs of
    that version (main and a release may report one version), else main's."""
    data = table()
    refs, main = data["refs"], data["main"]
    if nemo_rl_version is None:
        return Reserved(dict(refs[main]["keys"]), f"NeMo-RL main at {main} (no NeMo-RL installed here)")
    matching = [ref for ref, entry in refs.items() if _release(entry["version"]) == _release(nemo_rl_version)]
    if not matching:
        read = ", ".join(refs)
        return Reserved(
            dict(refs[main]["keys"]), f"NeMo-RL main at {main} (the installed {nemo_rl_version} is none of {read})"
        )
    keys: dict[str, str | None] = {}
    for ref in matching:
        keys.update(refs[ref]["keys"])
    return Reserved(keys, f"NeMo-RL {nemo_rl_version} ({' or '.join(matching)})")


@functools.cache
def installed_nemo_rl() -> str | None:
    """The installed NeMo-RL's version (None where it is not installed, as where ``check`` runs):
    nothing is imported, and where no ``nemo_rl`` is found not even the distribution metadata."""
    import importlib.util
    import sys

    if "nemo_rl" not in sys.modules and importlib.util.find_spec("nemo_rl") is None:
        return None
    from nemo_rl_attn_align.vocab import host_versions as versions

    return versions.installed_version("NeMo-RL")
