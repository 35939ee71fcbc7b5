"""Shared fixtures of the link tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

LENET_SHAPES = {
    "conv1.weight": (6, 1, 5, 5),
    "conv1.bias": (6,),
    "conv2.weight": (16, 6, 5, 5),
    "conv2.bias": (16,),
    "fc1.weight": (120, 400),
    "fc1.bias": (120,),
    "fc2.weight": (84, 120),
    "fc2.bias": (84,),
    "fc3.weight": (10, 84),
    "fc3.bias": (10,),
}


def lenet_state_dict(seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 arrays shaped like LeNet-5 (61,706 parameters)."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in LENET_SHAPES.items()}


@pytest.fixture
def lenet_sd() -> dict[str, np.ndarray]:
    """A LeNet-size random state dict."""
    return lenet_state_dict()


@pytest.fixture
def make_lenet() -> Callable[[int], dict[str, np.ndarray]]:
    """Factory of seeded LeNet-size random state dicts (tests import no helper modules)."""
    return lenet_state_dict
