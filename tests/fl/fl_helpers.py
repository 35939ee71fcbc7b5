"""Helpers shared by the FL runtime tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.fl.data import FASHION_MNIST_DIR, FASHION_MNIST_FILES, ImageData

HAVE_FMNIST = all((FASHION_MNIST_DIR / n).is_file() for n in FASHION_MNIST_FILES)
needs_fmnist = pytest.mark.skipif(
    not HAVE_FMNIST, reason="FashionMNIST not installed (apt install dataset-fashion-mnist)"
)


def toy_data(n: int = 300, seed: int = 0) -> ImageData:
    """``n`` seeded random 28x28 grey images with labels 0..9 (no data set needed)."""
    rng = np.random.default_rng(seed)
    return ImageData(
        torch.from_numpy(rng.integers(0, 256, (n, 1, 28, 28)).astype(np.uint8)),
        torch.from_numpy(rng.integers(0, 10, n)),
        (0.5,),
        (0.3,),
        10,
    )
