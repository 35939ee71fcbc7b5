"""Shared fixtures of the link tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from scaleflu.link.samples import lenet_like


@pytest.fixture
def lenet_sd() -> dict[str, np.ndarray]:
    """A LeNet-size random state dict."""
    return lenet_like()


@pytest.fixture
def make_lenet() -> Callable[[int], dict[str, np.ndarray]]:
    """Factory of seeded LeNet-size random state dicts (tests import no helper modules)."""
    return lenet_like
