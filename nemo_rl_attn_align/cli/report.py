"""``nemo-rl-attn-align report PATH``: render an attention_align run report as a table.

PATH is the report file (``attention_align_report.json``) or its directory (by default
``<logger.log_dir>/attention_align``); a directory holding only worker records is collected on the
spot. Exit 0: the report is readable and its verdict is pass or incomparable; 1: its verdict is
fail; 2: the input cannot be read (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_FAILED, EXIT_UNREADABLE = 0, 1, 2


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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``report``; returns the exit code."""
    from nemo_rl_attn_align.limits import shown_path, shown_text
    from nemo_rl_attn_align.report.document import ReportError, load_report
    from nemo_rl_attn_align.report.render import render_summary

    try:
        doc = load_report(args.path)
        text = json.dumps(doc, indent=2) if args.json else render_summary(doc, full=args.all)
    except ReportError as err:
        print(f"error: {shown_text(str(err), 2000)}", file=sys.stderr)
        return EXIT_UNREADABLE
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        print(
            f"error: {shown_path(args.path)}: the report is malformed ({type(err).__name__}: {shown_text(str(err))}); "
            "it was not written by this version of nemo-rl-attn-align",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    print(text)
    return EXIT_FAILED if doc["verdict"] == "fail" else EXIT_OK
