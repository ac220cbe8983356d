"""The report as scalars for the user's experiment tracker, logged under ``attention_align/`` (``vocab.names.BLOCK``)
through NeMo-RL's own ``Logger`` (so every backend it has gets them; docs/running-in-nemo-rl.md "Metrics in your
tracker" has the legend). Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_attn_align.vocab.codes import Code

#: ``verdict`` as a number: higher is better.
VERDICT_VALUES = {"pass": 1.0, "incomparable": 0.0, "fail": -1.0}
#: The estimate's figures logged as ``attention_only/<name>``.
ESTIMATED = ("token_mult_prob_error", "gen_kl_error")


def _field_counts(binding: Mapping[str, Any] | None) -> dict[str, float]:
    if not binding:
        return {}
    bound = [f for f in binding["fields"] if f["tier"] != "recorded"]
    determinism = binding.get("determinism") or {"entries": []}
    return {
        "fields_matching": float(sum(f["status"] in ("match", "allowed") for f in bound)),
        "fields_mismatching": float(sum(f["status"] == "mismatch" for f in bound)),
        "fields_not_comparable": float(sum(f["status"] == "not_comparable" for f in bound)),
        "determinism_blocking": float(
            sum(e["tier"] == "blocking" and e["status"] == "mismatch" for e in determinism["entries"])
        ),
    }


def _readback(doc: Mapping[str, Any]) -> dict[str, float]:
    stages = doc["workers"]["stages"].get("training", {})
    read_back = {f"workers.{wid}" for wid, stage in stages.items() if stage == "first_forward"}
    differs = [
        f
        for f in doc["findings"]
        if f["code"] == Code.REPORT_WORKER_FINDING.value and f["value"] == "first_forward" and f["key"] in read_back
    ]
    return {"readback_workers": float(len(read_back)), "readback_mismatches": float(len(differs))}


def _estimate(drift: Mapping[str, Any]) -> dict[str, float]:
    estimate = drift.get("attention_only") or {}
    if estimate.get("status") not in ("estimated", "zero_by_construction"):
        return {}
    figures = estimate.get("figures") or {}
    return {f"attention_only/{name}": float(figures[name]["value"]) for name in ESTIMATED if name in figures}


def tracker_metrics(doc: Mapping[str, Any]) -> dict[str, float]:
    """The report document ``doc`` as numbers, without the prefix: ``verdict`` (1 pass, 0
    incomparable, -1 fail), workers recorded / expected per side, the binding's field and
    determinism counts, the Transformer Engine read-back and the attention-only drift estimate."""
    out = {"verdict": VERDICT_VALUES[doc["verdict"]]}
    for side, coverage in doc["workers"].get("coverage", {}).items():
        out[f"workers_recorded/{side}"] = float(coverage["recorded"])
        if coverage.get("expected") is not None:
            out[f"workers_expected/{side}"] = float(coverage["expected"])
    out.update(_field_counts(doc.get("binding")))
    out.update(_readback(doc))
    out.update(_estimate(doc["drift"]))
    return out
