"""Fixtures of the baseline tests: the shared tiny run and contexts per scenario."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiny_run_helpers import HAVE_FMNIST, tiny_config, tiny_run_dir


@pytest.fixture(scope="session")
def tiny_run(build_once: Callable[..., Path]) -> Any:
    """The shared tiny trained run, loaded."""
    if not HAVE_FMNIST:
        pytest.skip("FashionMNIST not installed")
    from scaleflu.fl.run import load_run

    return load_run(tiny_run_dir(build_once))


@pytest.fixture(scope="session")
def make_ctx(tiny_run: Any) -> Callable[..., Any]:
    """Context factory: ``make_ctx("client:0")`` (cached per request)."""
    from scaleflu.experiments.harness import make_context

    cache: dict[str, Any] = {}
    cfg = tiny_config()

    def make(request: str) -> Any:
        if request not in cache:
            cache[request] = make_context(tiny_run, request, cfg, progress=False)
        return cache[request]

    return make
