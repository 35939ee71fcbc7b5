"""Shared pytest set-up: quiet GNU Radio preferences, deterministic torch threads."""

import os

os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
os.environ.setdefault("SCALEFLU_LOG", "WARNING")
