"""Logging configured in one place for the command line and the apps."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str | int | None = None) -> None:
    """Configure the root logger once; ``SCALEFLU_LOG`` (e.g. DEBUG) overrides the default INFO."""
    if level is None:
        level = os.environ.get("SCALEFLU_LOG", "INFO")
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            level = logging.INFO
    logging.basicConfig(level=level, format=FORMAT, datefmt="%H:%M:%S", force=True)


def fmt(value: object, digits: int = 4) -> str:
    """A value for a log line: floats to ``digits`` significant digits, mappings as ``k=v``.

    ``{"ra": 0.91234567, "fa": None}`` gives ``ra=0.9123 fa=n/a``; lists are formatted item by
    item; anything else is ``str()``.
    """
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={fmt(v, digits)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v, digits) for v in value) + "]"
    return str(value)
