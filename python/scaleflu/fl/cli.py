"""The ``train`` sub-command: FedAvg from a config file with overrides, into a run directory."""

from __future__ import annotations

import argparse
import csv
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scaleflu.cliargs import add_config_args

log = logging.getLogger(__name__)


def add_train_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``train --config FILE [--set k=v ...] [--out DIR] [--backend B] [--resume]``."""
    p = subparsers.add_parser(
        "train",
        help="train FedAvg and record the history unlearning needs",
        description="Train FedAvg (models, data and Table I defaults from the config) into a run "
        "directory: config.yaml, metrics.jsonl, metrics.csv, training.png, model.safetensors, "
        "history/.",
    )
    add_config_args(p)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory (default: runs/fl-<YYYYmmdd-HHMMSS>)",
    )
    p.add_argument("--backend", choices=("local", "ray"), default=None, help="override fl.backend")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last round"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--keys",
        default=None,
        metavar="FILE",
        help="key file (`scaleflu keys integrity`, or a testbed server's keys.json): the history "
        "and model.safetensors carry an authenticated digest, checked on --resume and load",
    )
    p.set_defaults(func=run_train)
    return p


def run_train(args: argparse.Namespace) -> int:
    """Run the ``train`` sub-command; returns the process exit status."""
    from scaleflu.config import ConfigError, load_config
    from scaleflu.fl.history import DivergedError
    from scaleflu.fl.run import train

    overrides = list(args.overrides or [])
    if args.backend:
        overrides.append(f"fl.backend={args.backend}")
    out = args.out
    if out is None:
        if args.resume:
            log.error("--resume needs --out RUN_DIR")
            return 2
        out = Path("runs") / time.strftime("fl-%Y%m%d-%H%M%S")
    try:
        cfg = load_config(args.config, overrides)
        if args.keys is not None:
            from scaleflu.unlearn.cli import trust_keys

            trust_keys(out, args.keys)
        result = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except DivergedError as exc:
        log.error("%s", exc)
        return 1
    csv_path, png_path = write_training_outputs(result.metrics, out)
    log.info(
        "run written to %s (final test accuracy %.4f; %s, %s)",
        out,
        result.final_acc,
        csv_path.name,
        png_path.name if png_path else "no plot",
    )
    return 0


CSV_COLUMNS = ("round", "test_acc", "test_loss", "asr", "participants", "wall_s", "link_s")
CSV_COLUMNS += ("cum_link_s", "bytes")


def write_metrics_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """metrics.jsonl as a table: one row per round, participants space-separated."""
    cols = [c for c in CSV_COLUMNS if c != "asr" or any(r.get("asr") is not None for r in rows)]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            cells = []
            for c in cols:
                v = r.get(c)
                if c == "participants" and v is not None:
                    v = " ".join(str(n) for n in v)
                cells.append("" if v is None else v)
            w.writerow(cells)
    return path


def write_training_outputs(rows: Sequence[Mapping[str, Any]], run_dir: Path) -> tuple[Path, Any]:
    """``metrics.csv`` and ``training.png`` (accuracy and loss per round) in ``run_dir``."""
    from scaleflu.plots import plot_training

    run_dir = Path(run_dir)
    csv_path = write_metrics_csv(rows, run_dir / "metrics.csv")
    try:
        png = plot_training(rows, run_dir / "training.png", title=f"FedAvg: {run_dir.name}")
    except Exception as exc:  # a plotting problem must not fail a finished run
        log.warning("training.png not written: %s", exc)
        png = None
    return csv_path, png
