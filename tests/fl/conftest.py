"""Shared fixtures for the FL runtime tests: small configs on real FashionMNIST subsets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from scaleflu.config import load_config


@pytest.fixture
def small_cfg() -> Callable[..., dict[str, Any]]:
    """Config factory: 5 clients on a 2000-sample FashionMNIST subset, plus overrides."""

    def make(*overrides: str) -> dict[str, Any]:
        base = [
            "data.num_clients=5",
            "data.train_subset=2000",
            "data.test_subset=1000",
            "fl.clients_per_round=5",
            "fl.rounds=3",
            "fl.local_epochs=1",
            "fl.batch_size=32",
            "fl.lr=0.05",
        ]
        return load_config(None, [*base, *overrides])

    return make


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: far faster for LeNet-sized work on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
