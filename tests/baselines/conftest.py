"""Fixtures of the baseline tests: the shared tiny run and contexts per scenario."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiny_run_helpers import HAVE_FMNIST, tiny_config, tiny_run_dir

# the small protocol-with-power run plus membership canaries on the attacker (client 0): the
# canary MIA's and the membership audit's tests share it
CANARIES = [
    "data.poison.canary_clients=[0]",
    "data.poison.canaries=40",
    "data.poison.canary_copies=12",
]


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


@pytest.fixture(scope="session")
def canary_run(build_once: Callable[..., Path]) -> tuple[Any, dict[str, Any]]:
    """The protocol-with-power run plus canaries, trained once (about a minute on one core)."""
    if not HAVE_FMNIST:
        pytest.skip("FashionMNIST not installed")
    import torch
    from test_protocol_power import POWER

    from scaleflu.experiments.cells import RunKey
    from scaleflu.experiments.harness import ensure_run
    from scaleflu.fl.run import load_run

    cfg = tiny_config(*POWER, *CANARIES)
    key = RunKey("fashion_mnist", "lenet", float(cfg["data"]["alpha"]), 0)

    def build(out: Path) -> None:
        torch.set_num_threads(1)
        ensure_run(cfg, key, out, progress=False)

    return load_run(build_once("canary-run", build) / "runs" / key.slug), cfg
