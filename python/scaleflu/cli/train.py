"""The ``train`` sub-command: FedAvg from a config file with overrides, into a run directory."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from scaleflu.cli.args import add_config_args, trust_keys

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
        "--resume",
        action="store_true",
        help="continue the run in --out from its last round, with the config it saved (--set "
        "may extend it, e.g. fl.rounds)",
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
    config = args.config
    if args.resume and config is None:  # the run's own config: no need to repeat every --set
        config = out / "config.yaml"
        if not config.is_file():
            log.error("--resume: %s holds no run to continue (no config.yaml)", out)
            return 2
    try:
        cfg = load_config(config, overrides, args.plugins)
        trust_keys(out, args.keys)
        result = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except DivergedError as exc:
        log.error("%s", exc)
        return 1
    log.info(
        "run written to %s (final test accuracy %.4f; %s)",
        out,
        result.final_acc,
        "metrics.csv, training.png" if (out / "training.png").is_file() else "metrics.csv",
    )
    return 0
