"""Fixtures of the harness tests: the tiny run shared with tests/baselines (trained once)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tiny_run_helpers import HAVE_FMNIST, tiny_run_dir


@pytest.fixture(scope="session")
def tiny_run_path(build_once: Callable[..., Path]) -> Path:
    """Directory of the shared tiny trained run."""
    if not HAVE_FMNIST:
        pytest.skip("FashionMNIST not installed")
    return tiny_run_dir(build_once)
