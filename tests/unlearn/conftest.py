"""Shared fixtures for the unlearning tests: one small poisoned FashionMNIST run per session.

The run: 5 IID clients over 6000 FashionMNIST training images (test 1500), LeNet, 10 FedAvg
rounds with every client in every round. Client 2 carries a backdoor (30 % of its samples get
the trigger and label 0); client 4 has 20 % flipped labels (sample unlearning).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from scaleflu.config import load_config
from scaleflu.fl.data import FASHION_MNIST_DIR
from scaleflu.fl.run import LoadedRun, load_run, train

RUN_OVERRIDES = [
    "seed=0",
    "data.num_clients=5",
    "data.train_subset=6000",
    "data.test_subset=1500",
    "data.partition=iid",
    "data.poison.backdoor_clients=[2]",
    "data.poison.backdoor_fraction=0.3",
    "data.poison.label_flip_clients=[4]",
    "data.poison.label_flip_fraction=0.2",
    "fl.rounds=10",
    "fl.local_epochs=2",
    "fl.lr=0.02",
    "fl.momentum=0.9",
    "fl.batch_size=32",
    "fl.clients_per_round=5",
    "fl.trainer=sequential",
]


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def trained_run(build_once: Callable[..., Path]) -> Path:
    """Directory of the shared trained run."""
    if (
        not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").exists()
        and not (FASHION_MNIST_DIR / "train-images-idx3-ubyte").exists()
    ):
        pytest.skip("FashionMNIST not installed in /usr/share/datasets/fashion-mnist")

    def build(out: Path) -> None:
        torch.set_num_threads(1)
        train(load_config(None, RUN_OVERRIDES), out / "run", progress=False)

    return build_once("unlearn-run", build) / "run"


@pytest.fixture(scope="session")
def loaded_run(trained_run: Path) -> LoadedRun:
    """The shared run loaded back (data, partitions, history, final model)."""
    return load_run(trained_run)
