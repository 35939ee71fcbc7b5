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
