"""Ray backend: each client a Ray task on a local instance; same model as the local backend."""

from __future__ import annotations

from collections.abc import Callable
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
