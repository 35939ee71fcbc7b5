"""One tiny trained run shared by the baseline and harness tests (trained once per session).

5 IID clients on a 3000-image FashionMNIST subset, 6 rounds of 2 local epochs; client 0
carries a 5x5 backdoor trigger on half its samples (the test run reaches an attack success of
about 0.7), client 1 has 30 % flipped labels. Evaluation is kept small (no relearn, small MIA).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from scaleflu.config import load_config
from scaleflu.fl.data import FASHION_MNIST_DIR, FASHION_MNIST_FILES

HAVE_FMNIST = all((FASHION_MNIST_DIR / n).is_file() for n in FASHION_MNIST_FILES)
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="FashionMNIST not installed")

TINY_OVERRIDES = [
    "data.num_clients=5",
    "data.partition=iid",
    "data.train_subset=3000",
    "data.test_subset=1000",
    "data.poison.backdoor_clients=[0]",
    "data.poison.backdoor_fraction=0.5",
    "data.poison.trigger_size=5",
    "data.poison.label_flip_clients=[1]",
    "data.poison.label_flip_fraction=0.3",
    "fl.rounds=6",
    "fl.local_epochs=2",
    "fl.lr=0.05",
    "fl.momentum=0.9",
    "fl.clients_per_round=5",
    "fl.batch_size=32",
    "fl.threads=1",
    "scale.val_size=200",
    "scale.ppo.episodes=3",
    "scale.ppo.n_steps=8",
    "scale.ppo.batch_size=8",
    "scale.recovery_rounds=1",
    "scale.eval.max_samples=1500",
    "scale.eval.mia_samples=300",
    "scale.eval.relearn_max_rounds=0",
    "baselines.fused.rounds=2",
    "baselines.pga.post_rounds=1",
    "baselines.fedraser.interval=2",
    "experiment.seeds=[0]",
]


def tiny_config(*extra: str) -> dict[str, Any]:
    """The tiny experiment config (plus overrides)."""
    return load_config(None, [*TINY_OVERRIDES, *extra])


def tiny_run_dir(build_once: Callable[..., Path]) -> Path:
    """The tiny run, trained once for the whole test run (``build_once``: tests/conftest.py)."""
    from scaleflu.experiments.cells import RunKey
    from scaleflu.experiments.harness import ensure_run

    cfg = tiny_config()
    key = RunKey("fashion_mnist", "lenet", float(cfg["data"]["alpha"]), 0)

    def build(out: Path) -> None:
        torch.set_num_threads(1)
        ensure_run(cfg, key, out, progress=False)

    return build_once("tiny-shared", build) / "runs" / key.slug
