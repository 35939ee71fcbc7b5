"""Shared pytest set-up: quiet GNU Radio preferences, logging that cannot leak between tests."""

import atexit
import logging
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
# GRC in the tests loads GNU Radio's own blocks plus the block YAML a test names (GRC_BLOCKS_PATH,
# mostly the tree's grc/), never a copy of ours installed under /usr/local for GNU Radio
# Companion: GRC lets a later block path replace an earlier one's blocks.
os.environ.setdefault("GR_CONF_GRC_GLOBAL_BLOCKS_PATH", "/usr/share/gnuradio/grc/blocks")
os.environ.setdefault("SCALEFLU_LOG", "WARNING")


def _writable_home() -> None:
    """Whoever runs the suite: a user without a writable home (``nobody``: HOME=/nonexistent)
    gets a private temporary one for this run, inherited by the subprocesses. GNU Radio's GRC
    (the Platform and grcc) writes its block cache to ~/.cache and fails without it."""
    home = os.path.expanduser("~")
    if os.path.isdir(home) and os.access(home, os.W_OK):
        return
    tmp = tempfile.mkdtemp(prefix="scaleflu-home-")
    atexit.register(shutil.rmtree, tmp, True)
    os.environ["HOME"] = tmp


_writable_home()


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """Put the root logger back after each test.

    Commands under test call ``setup_logging`` (``basicConfig(force=True)``), which binds a
    handler to that test's captured stderr; left in place, later tests would log into a
    closed stream.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
