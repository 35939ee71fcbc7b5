"""Fixtures of the GNU Radio tests: skip cleanly without GNU Radio, close networks after each."""

from __future__ import annotations

import numpy as np
import pytest

gr = pytest.importorskip("gnuradio.gr", reason="GNU Radio is not installed")
pytest.importorskip("gnuradio.scaleflu", reason="the scaleflu C++ blocks are not built")

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


def lenet_like(seed: int) -> dict[str, np.ndarray]:
    """Random float32 arrays shaped like LeNet-5 (61,706 parameters, 247 kB)."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in LENET_SHAPES.items()}


@pytest.fixture
def lenet_state_dict():
    return lenet_like


@pytest.fixture(autouse=True)
def _close_networks():
    yield
    from scaleflu.radio.links import close_networks

    close_networks()
