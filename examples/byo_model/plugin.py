"""A gr-scaleflu plugin: your own model and data set, registered by name.

``model.name: smallcnn`` builds :class:`SmallCNN`; ``data.dataset: shapes`` loads the ``.npz``
files that ``make_data.py`` writes (``data.root``: their folder; default ``data/`` beside this
file). A config names this file in ``plugins``; every process that loads that config -- train,
unlearn, the Table II harness, the testbed's server and robots -- imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scaleflu.fl.data import load_npz
from scaleflu.plugins import register_dataset, register_model

HERE = Path(__file__).resolve().parent


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with max pooling and two linear layers: small images, any classes."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        side = image_size // 4
        self.fc1 = nn.Linear(32 * side * side, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def build_smallcnn(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """The model builder: scaleflu passes the data set's classes, channels and image side."""
    return SmallCNN(num_classes, in_channels, image_size)


def load_shapes(data_cfg: Mapping[str, Any], seed: int) -> tuple[Any, Any]:
    """The data set loader: (train, test), each (uint8 images (M, H, W), int labels (M,)).

    Arrays only: ``load_npz`` reads with allow_pickle=False, so a file holding objects is
    refused instead of run.
    """
    root = Path(data_cfg.get("root") or HERE / "data")
    train = load_npz(root / "train.npz", "images", "labels")
    test = load_npz(root / "test.npz", "images", "labels")
    return train, test


register_model("smallcnn", build_smallcnn)
register_dataset("shapes", load_shapes)
