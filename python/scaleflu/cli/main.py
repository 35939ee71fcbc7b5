"""The ``scaleflu`` command: one entry point, one sub-command per job.

Each sub-command is a module of this package that registers itself (``add_<name>_parser``).
Those modules import only :mod:`scaleflu.cli.args` and :mod:`scaleflu.config` at import time
(never this module, never torch): ``scaleflu --help`` stays fast. Global options
(``--log-level``) are accepted before and after the sub-command; every error is one log line
and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from scaleflu import __version__
from scaleflu.cli.args import (
    add_config_args,
    add_global_args,
    add_global_args_everywhere,
    run_one_line,
)
from scaleflu.log import setup_logging

__all__ = ["add_config_args", "build_parser", "main"]

log = logging.getLogger("scaleflu")

# (module, function that adds the sub-parser): each registers one or more sub-commands and
# sets ``func`` on them. A module that is missing or fails to import is reported, not fatal.
SUBCOMMAND_PROVIDERS: list[tuple[str, str]] = [
    ("scaleflu.cli.train", "add_train_parser"),
    ("scaleflu.cli.unlearn", "add_unlearn_parser"),
    ("scaleflu.cli.experiment", "add_experiment_parser"),
    ("scaleflu.cli.testbed", "add_testbed_parser"),
    ("scaleflu.cli.keys", "add_keys_parser"),
    ("scaleflu.cli.receipt", "add_receipt_parser"),
    ("scaleflu.cli.history", "add_history_parser"),
    ("scaleflu.cli.iplink", "add_iplink_parser"),
]


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from scaleflu.config import load_config

    cfg = load_config(args.config, args.overrides, args.plugins)
    sys.stdout.write(yaml.safe_dump(cfg, sort_keys=False))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    lines = [f"gr-scaleflu {__version__}", f"python {platform.python_version()}"]
    for mod, attr in (("numpy", "__version__"), ("torch", "__version__")):
        try:
            lines.append(f"{mod} {getattr(importlib.import_module(mod), attr)}")
        except ImportError:
            lines.append(f"{mod}: not installed")
    try:
        from gnuradio import gr

        lines.append(f"gnuradio {gr.version()}")
        from gnuradio import scaleflu  # noqa: F401

        lines.append("gnuradio.scaleflu blocks: importable")
    except ImportError as exc:
        lines.append(f"gnuradio / gnuradio.scaleflu: not importable ({exc})")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="scaleflu",
        description="SCALE federated unlearning over GNU Radio OFDM links.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("config", help="print the resolved configuration")
    add_config_args(p)
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("info", help="versions and what is importable here")
    p.set_defaults(func=_cmd_info)

    for module, fn in SUBCOMMAND_PROVIDERS:
        try:
            add: Callable[[Any], None] = getattr(importlib.import_module(module), fn)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                continue  # that part of the product is not there yet
            raise
        add(sub)
    add_global_args_everywhere(parser)
    return parser


# The collector's first-generation threshold for a command (Python's default: 700 allocations).
# Importing torch and the run creates a few hundred thousand long-lived objects; at 700 the
# collector ran about 400 times and walked them all in its oldest generation, 0.15-0.2 s of a
# 2.5 s ``scaleflu unlearn --method scale`` process. At 50 000 it runs a few times and never
# that far; a command's steady state makes few container objects, so little waits longer.
# Set by entry(), the process's entry point, with its freeze at the end.
GC_THRESHOLD = (50_000, 20, 10)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``scaleflu`` command on ``argv`` (default: the process's arguments); its exit code."""
    return _main(argv)[0]


def _main(argv: Sequence[str] | None) -> tuple[int, argparse.Namespace]:
    """:func:`main`, and the parsed arguments (what the process's end may depend on)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2, args
    return run_one_line(args.func, args, logger=log), args


def end_process(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, when nothing is lost.

    What a normal end does that matters is done here too: the atexit handlers run (logging's
    shutdown flushes and closes its handlers; ``weakref.finalize`` objects, temporary folders,
    multiprocessing's children), then standard output and error are flushed; only the teardown
    of the modules and of the C++ libraries' static objects is skipped (about 0.1-0.2 s of a
    ``scaleflu unlearn`` process, docs/results/scale.md, "The command as a whole process").
    Returns without doing
    anything while another non-daemon thread is alive (a normal end would wait for it) or where
    the interpreter does not offer its atexit runner.
    """
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None:
        return
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or a broken pipe: nothing more can be written
            pass
    os._exit(code)


def entry() -> int:
    """The ``scaleflu`` process (the console script, ``python -m scaleflu``): :func:`main` with
    the collector set for a process that ends when the command does.

    The first-generation threshold is :data:`GC_THRESHOLD`. When the command is over, what is
    alive lives until the interpreter ends: frozen (``gc.freeze``), the collections of its
    shutdown pass over it (0.3 s of the 0.45 s a ``scaleflu unlearn`` process spent ending,
    walking torch's objects again and again); atexit handlers and finalisers still run, nothing
    is skipped. A sub-command that sets ``end_at_once`` (``unlearn``: every file it writes is
    closed when it returns) then ends the process through :func:`end_process`, without the
    rest of the interpreter's teardown. (:func:`main` called in a process that goes on, as the
    tests do, changes neither.)"""
    gc.set_threshold(*GC_THRESHOLD)
    try:
        code, args = _main(None)
    finally:
        gc.freeze()
    if getattr(args, "end_at_once", False):
        end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(entry())
