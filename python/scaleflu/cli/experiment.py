"""``scaleflu experiment table2``: run (or resume) the Table II grid and write its report."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from scaleflu.cli.args import add_config_args

log = logging.getLogger(__name__)


def _cmd_table2(args: argparse.Namespace) -> int:
    from scaleflu.config import load_config
    from scaleflu.experiments.report import write_report
    from scaleflu.experiments.table2 import run_table2

    cfg = load_config(args.config, args.overrides, args.plugins)
    if args.report_only:
        paths = write_report(cfg, args.out)
        log.info("report written: %s", ", ".join(str(p) for p in paths.values()))
        return 0
    summary = run_table2(cfg, args.out, progress=not args.no_progress, report=not args.no_report)
    return 1 if summary["failed"] else 0


def add_experiment_parser(subparsers: Any) -> None:
    """Register ``experiment`` (with ``table2``) on the main CLI's sub-parsers."""
    p = subparsers.add_parser("experiment", help="reproduce the paper's tables and figures")
    sub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    t = sub.add_parser(
        "table2",
        help="methods x models x scenarios x seeds: Table II, CSV and figures (resumable)",
        description=(
            "Run the Table II grid (experiment.* keys); finished cells are reused, failed "
            "cells are recorded and retried on the next call. --config also takes a packaged "
            "config by name: table2_cpu, table2_paper."
        ),
    )
    t.add_argument("--out", default="results/table2", help="output folder (default %(default)s)")
    t.add_argument("--no-progress", action="store_true", help="hide progress bars")
    t.add_argument(
        "--report-only", action="store_true", help="only rewrite table and figures from the cells"
    )
    t.add_argument(
        "--no-report",
        action="store_true",
        help="run the cells but write no table/figures (for several processes sharing one --out, "
        "split by experiment.seeds / experiment.models; then one --report-only)",
    )
    add_config_args(t, example="experiment.seeds=[0]")
    t.set_defaults(func=_cmd_table2)

    def _no_sub(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_no_sub)
