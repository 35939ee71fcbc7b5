"""Command lines: the ``scaleflu`` command and the apps (``apps/*.py`` are thin wrappers).

``main`` dispatches to one module per sub-command (``train``, ``unlearn``, ``experiment``,
``testbed``, ``keys``); ``args`` holds the argument-parsing pieces they share. No module
outside this package imports it: the domain packages know nothing of command lines.
"""

from scaleflu.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
