"""``nemo-rl-attn-align report PATH``: render an attention_align run report as a table.

PATH is the report file (``attention_align_report.json``) or its directory (by default
``<logger.log_dir>/attention_align``); a directory holding only worker records is collected on the
spot. Exit 0: the report is readable and its verdict is pass or incomparable; 1: its verdict is
fail; 2: the input cannot be read (one line on stderr says why).

``--plot [OUT.png]`` also writes NeMo-RL's mismatch metrics over the steps, with the attention-only
estimate as a band, as one PNG (``report.report_plot``; default ``<report dir>/attention_align_drift.png``)
and prints ``plot: PATH`` after the text (on stderr with ``--json``, so stdout stays JSON). Exit 2
when it cannot be written: no drift steps, no matplotlib, an unwritable OUT.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nemo_rl_attn_align.vocab import jsonio
from nemo_rl_attn_align.vocab.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE


def register(subparsers) -> None:
    """Add the ``report`` parser."""
    parser = subparsers.add_parser(
        "report",
        help="render an attention_align run report (train/rollout binding, determinism, drift) as a table",
        description="Render the run report written by the driver. Exit 0: readable, verdict pass or "
        "incomparable; 1: verdict fail; 2: unreadable input.",
    )
    parser.add_argument("path", metavar="PATH", help="the report JSON file, or the report directory")
    parser.add_argument("--all", action="store_true", help="list every field and variable, matching ones too")
    parser.add_argument("--json", action="store_true", help="print the report document itself")
    parser.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        metavar="OUT.png",
        help="also write a PNG of NeMo-RL's mismatch metrics over the steps with the attention-only estimate "
        "(default: <report dir>/attention_align_drift.png; needs the plot extra); put PATH before it",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``report``; returns the exit code."""
    from nemo_rl_attn_align.report.load import ReportError, load_report
    from nemo_rl_attn_align.report.report_render import render_summary
    from nemo_rl_attn_align.vocab.limits import shown_path, shown_text

    try:
        doc = load_report(args.path)
        text = None if args.json else render_summary(doc, full=args.all)
    except ReportError as err:
        print(f"error: {shown_text(str(err), 2000)}", file=sys.stderr)
        return EXIT_UNUSABLE
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        print(
            f"error: {shown_path(args.path)}: the report is malformed ({type(err).__name__}: {shown_text(str(err))}); "
            "it was not written by this version of nemo-rl-attn-align",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    if text is None:  # --json: written in chunks (a report of 10,000 workers is tens of megabytes)
        jsonio.write(sys.stdout, doc)
        sys.stdout.write("\n")
    else:
        print(text)
    if args.plot is not None and not _write_plot(args, doc):
        return EXIT_UNUSABLE
    return EXIT_FAILED if doc["verdict"] == "fail" else EXIT_OK


def _write_plot(args: argparse.Namespace, doc: dict[str, Any]) -> bool:
    """Write ``--plot``'s PNG and print ``plot: PATH``; False (one line on stderr) when it cannot be."""
    from nemo_rl_attn_align.report.report_plot import PLOT_FILENAME, PlotError, write_drift_plot
    from nemo_rl_attn_align.vocab.limits import shown_path, shown_text

    path = Path(args.path)
    out = Path(args.plot) if args.plot else (path if path.is_dir() else path.parent) / PLOT_FILENAME
    try:
        written = write_drift_plot(doc, out)
    except PlotError as err:
        print(f"error: {shown_text(str(err), 2000)}", file=sys.stderr)
        return False
    print(f"plot: {shown_path(written)}", file=sys.stderr if args.json else sys.stdout)
    return True
