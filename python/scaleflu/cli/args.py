"""Argument-parsing pieces shared by ``scaleflu`` and the apps (argparse; the rest lazily).

Sub-command modules import from here, never from :mod:`scaleflu.cli.main` (which imports them).
"""

from __future__ import annotations

import argparse
import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("scaleflu")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# when the command began (this module is imported first): summaries give its real wall time
COMMAND_STARTED = time.monotonic()


def add_config_args(p: argparse.ArgumentParser, example: str = "fl.lr=0.01") -> None:
    """The --config/--set pair every configurable command accepts.

    ``example`` is a key this command really accepts, shown in ``--help``.
    """
    p.add_argument(
        "--config",
        "-c",
        metavar="FILE|NAME",
        help="YAML or TOML file over the Table I defaults, or a packaged config by name "
        "(table2_cpu, table2_paper)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override one value, e.g. --set {example} (repeatable)",
    )
    p.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE|FILE.py",
        help="your module (or .py file) that registers models and data sets by name "
        "(scaleflu.plugins); added to the config's plugins (repeatable)",
    )


def method_arg(text: str) -> str:
    """argparse ``type`` of ``--method``: a registered name or alias, as its registered name."""
    from scaleflu.unlearn.registry import canonical_name

    try:
        return canonical_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def method_help(text: str) -> str:
    """``text`` followed by the registry's method names and their aliases."""
    from scaleflu.unlearn.registry import method_aliases

    names = [
        f"{name} (also {', '.join(aliases)})" if aliases else name
        for name, aliases in method_aliases().items()
    ]
    return f"{text}: {', '.join(names)}"


def add_global_args(p: argparse.ArgumentParser, *, in_subcommand: bool = False) -> None:
    """``--log-level``, accepted before and after the sub-command.

    In a sub-parser the default is suppressed so that a value given before the sub-command is
    not overwritten by the sub-parser's default.
    """
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS if in_subcommand else None,
        help="DEBUG, INFO (default), WARNING, ERROR (also SCALEFLU_LOG)",
    )


def add_global_args_everywhere(parser: argparse.ArgumentParser) -> None:
    """Add the global options to every (nested) sub-parser of ``parser`` that lacks them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                if "-" not in sub.prefix_chars:
                    continue  # a pass-through sub-command (testbed): its own parser decides
                if "--log-level" not in sub._option_string_actions:
                    add_global_args(sub, in_subcommand=True)
                add_global_args_everywhere(sub)


def run_one_line(func: Callable[..., Any], *args: Any, logger: logging.Logger = log) -> int:
    """Call ``func(*args)``; any error becomes one log line and exit status 2 (1 for a crash).

    Expected errors (bad config, missing or unreadable file, bad value) give status 2; anything
    else status 1. The traceback is logged at DEBUG level only (``--log-level DEBUG``).
    """
    from scaleflu.config import ConfigError
    from scaleflu.fl.integrity import CorruptFileError, IntegrityError

    try:
        return int(func(*args) or 0)
    except KeyboardInterrupt:
        logger.warning("interrupted")
        return 130
    except IntegrityError as exc:  # a stored file failed its authenticated digest
        logger.error("refused: %s", exc)
        return 2
    except CorruptFileError as exc:  # its message starts with the file's path
        logger.error("unreadable file: %s", exc)
        logger.debug("%s", traceback.format_exc())
        return 2
    except ConfigError as exc:
        logger.error("configuration error: %s", exc)
        return 2
    except FileNotFoundError as exc:
        logger.error("file not found: %s", exc.filename or exc)
        return 2
    except (OSError, ValueError, KeyError) as exc:
        logger.error("%s: %s", type(exc).__name__, exc)
        logger.debug("%s", traceback.format_exc())
        return 2
    except Exception as exc:  # the last line of defence: one line, never a traceback
        logger.error("failed: %s: %s", type(exc).__name__, exc)
        logger.debug("%s", traceback.format_exc())
        return 1


def trust_keys(run_dir: str | Path, keys: str | Path | None) -> None:
    """``--keys FILE``: check (and write) the run's authenticated digests under its key, check
    its history's freshness against the heads file beside FILE, sign its erasure receipts."""
    if keys is None:
        return
    from scaleflu.fl.integrity import HistoryHeads, heads_path, trust
    from scaleflu.keys import load_integrity_key, receipt_signer

    key = load_integrity_key(keys)
    trust(run_dir, key, heads=HistoryHeads(heads_path(keys), key), signer=receipt_signer(keys))


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` like GNU Radio's apps, but not for empty defaults or twice."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if (
            "default" in help_text
            or action.default in (None, "", [], False, argparse.SUPPRESS)
            or action.option_strings == []
        ):
            return help_text
        return super()._get_help_string(action)
