"""Command lines: the ``scaleflu`` command and the apps (``apps/*.py`` are thin wrappers).

``main`` dispatches to one module per sub-command (``train``, ``unlearn``, ``experiment``,
``testbed``, ``keys``); ``args`` holds the argument-parsing pieces they share. Tools run as
``python -m``: ``scaleflu.cli.testbed edge_server|robot_client`` (the apps),
``scaleflu.cli.medium`` (a shared-medium broker), ``scaleflu.cli.linktest`` (one test message
over any link kind). No module
outside this package imports it: the domain packages know nothing of command lines.
"""

from scaleflu.cli.main import build_parser, entry, main

__all__ = ["build_parser", "entry", "main"]
