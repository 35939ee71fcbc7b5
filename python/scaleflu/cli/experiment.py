"""``scaleflu experiment table2``: run (or resume) the Table II grid and write its report."""

from __future__ import annotations

import argparse
import json
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


def _cmd_parity(args: argparse.Namespace) -> int:
    from scaleflu.experiments.parity import load_cells, parity_rows, parity_table, plot_parity
    from scaleflu.experiments.report import METHOD_LABELS

    try:
        rows = parity_rows(load_cells(args.outs))
    except FileNotFoundError as e:
        log.error("%s", e)
        return 2
    if not rows:
        log.error("no cell with a Retrain cell of the same run and request and an audit score")
        return 1
    print(parity_table(rows, METHOD_LABELS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    if args.plot:
        log.info("figure written: %s", plot_parity(rows, args.plot, METHOD_LABELS))
    return 0


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
    q = sub.add_parser(
        "parity",
        help="every method against Retrain's level over the runs of Table II outputs",
        description=(
            "Pool the cells of one or more Table II outputs (a cell in several: the last one "
            "given) and score each against the Retrain cell of its run and request: per run "
            "and at the mean, with 95 %% confidence intervals (docs/reproducing.md)."
        ),
    )
    q.add_argument("outs", nargs="+", metavar="OUT", help="Table II output folders")
    q.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    q.add_argument(
        "--plot", metavar="FILE", help="also draw the mean differences and intervals (PNG)"
    )
    q.set_defaults(func=_cmd_parity)

    def _no_sub(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_no_sub)
