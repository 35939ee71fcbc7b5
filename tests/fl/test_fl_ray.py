"""Ray backend: each client a Ray task on a local instance; same model as the local backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fl_helpers import needs_fmnist

from scaleflu.fl.ray_backend import ray_available
from scaleflu.fl.run import train

pytestmark = [
    needs_fmnist,
    pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install ray)"),
]


@pytest.fixture(scope="module", autouse=True)
def _ray_session() -> Iterator[None]:
    """One local Ray instance for the module (trainers only stop instances they started)."""
    import os

    import ray

    import scaleflu

    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    pkg_root = str(Path(scaleflu.__file__).resolve().parents[1])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": pkg_root}},
    )
    yield
    ray.shutdown()


def test_ray_equals_local(tmp_path: Path, small_cfg: Callable[..., dict[str, Any]]) -> None:
    base = [
        "fl.rounds=2",
        "fl.clients_per_round=3",
        "data.train_subset=600",
        "data.test_subset=200",
        "fl.trainer=sequential",
        "fl.ray_num_cpus=2",
    ]
    local = train(small_cfg(*base), tmp_path / "local", progress=False)
    ray_run = train(small_cfg(*base, "fl.backend=ray"), tmp_path / "ray", progress=False)
    for k, v in local.model.state_dict().items():
        assert torch.allclose(ray_run.model.state_dict()[k], v, atol=1e-5, rtol=1e-4), k
    assert ray_run.history.participants(2) == local.history.participants(2)
    upd_l = local.history.client_update(1, local.history.participants(1)[0])
    upd_r = ray_run.history.client_update(1, local.history.participants(1)[0])
    assert all(torch.allclose(upd_l[k], upd_r[k], atol=1e-5) for k in upd_l)


def test_ray_failed_client_is_dropped() -> None:
    import numpy as np

    from scaleflu.fl.data import ImageData
    from scaleflu.fl.fedavg import LocalConfig
    from scaleflu.fl.models import build_model
    from scaleflu.fl.ray_backend import RayTrainer

    rng = np.random.default_rng(0)
    data = ImageData(
        torch.from_numpy(rng.integers(0, 256, (40, 1, 28, 28)).astype(np.uint8)),
        torch.from_numpy(rng.integers(0, 10, 40)),
        (0.5,),
        (0.3,),
        10,
    )
    parts = [np.arange(0, 20), np.array([5, 10_000])]  # client 1 indexes past the data: fails
    trainer = RayTrainer(("lenet", 10, 1, 28), data, parts, LocalConfig(1, 0.01, 8), 0, num_cpus=2)
    try:
        start = build_model("lenet", 10, 1, 28).state_dict()
        out = trainer.train(start, [0, 1], 1)
    finally:
        trainer.shutdown()
    assert list(out) == [0]
