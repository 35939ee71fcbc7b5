"""Helpers shared by the FL runtime tests."""

from __future__ import annotations

import pytest

from scaleflu.fl.data import FASHION_MNIST_DIR, FASHION_MNIST_FILES

HAVE_FMNIST = all((FASHION_MNIST_DIR / n).is_file() for n in FASHION_MNIST_FILES)
needs_fmnist = pytest.mark.skipif(
    not HAVE_FMNIST, reason="FashionMNIST not installed (apt install dataset-fashion-mnist)"
)
