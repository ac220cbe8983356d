"""What the driver hands to every worker through the environment (stdlib only).

NeMo-RL copies the driver's whole ``os.environ`` into every Ray actor's ``runtime_env`` env_vars
when it creates a worker group (``RayWorkerGroup._create_workers_from_bundle_indices``, inside the
algorithm's ``setup()``), but a worker receives only the ``policy`` section of the config, never
the top-level ``attention_align:`` block. So the driver exports the settings the workers need as
one JSON variable at the start of ``setup()``, before any worker group exists. The launcher
(``nemo-rl-attn-align run``) sets the single-value variables, which win over the JSON in the
driver and in every worker alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass

from nemo_rl_attn_align.vocab import jsonio

SETTINGS_ENV = "NEMO_RL_ATTN_ALIGN_SETTINGS"
REPORT_DIR_ENV = "NEMO_RL_ATTN_ALIGN_REPORT_DIR"
STRICT_ENV = "NEMO_RL_ATTN_ALIGN_STRICT"

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class WorkerSettings:
    """The part of ``attention_align:`` a worker acts on, and the id of the driver's run
    (``on_mismatch`` is the driver's alone: it binds the workers' records and enforces it)."""

    strict: bool = False
    report_dir: str | None = None
    run_id: str | None = None


def export_settings(settings: WorkerSettings, environ: MutableMapping[str, str] = os.environ) -> None:
    """Put ``settings`` where every worker created afterwards will find them."""
    environ[SETTINGS_ENV] = jsonio.dumps(asdict(settings), sort_keys=True)


def worker_settings(environ: Mapping[str, str] = os.environ) -> WorkerSettings:
    """The settings exported by the driver; single-value variables override; defaults otherwise."""
    values: dict = {}
    raw = environ.get(SETTINGS_ENV)
    if raw:
        try:
            loaded = jsonio.loads(raw, SETTINGS_ENV)
        except (ValueError, RecursionError):  # not what the driver wrote: the defaults apply
            loaded = {}
        if isinstance(loaded, dict):
            values = {k: loaded[k] for k in ("strict", "report_dir", "run_id") if k in loaded}
    if STRICT_ENV in environ:
        values["strict"] = environ[STRICT_ENV].strip().lower() in _TRUE
    if environ.get(REPORT_DIR_ENV):
        values["report_dir"] = environ[REPORT_DIR_ENV]
    return WorkerSettings(
        strict=values.get("strict") is True,
        report_dir=values.get("report_dir")
        if isinstance(values.get("report_dir"), str) and values.get("report_dir")
        else None,
        run_id=values.get("run_id") if isinstance(values.get("run_id"), str) else None,
    )
