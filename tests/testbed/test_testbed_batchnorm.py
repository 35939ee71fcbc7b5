"""The testbed's edge server applies ``fl.bn_recalibration`` after aggregating, as training does.

A MobileNetV3 federation of three in-process robots, one round: with the key set, the global
model's BatchNorm running statistics are those the server re-estimates on its validation
images from the aggregated weights (``fl.fedavg.recalibrate_bn``); without it they are the
clients' averaged statistics, which differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scaleflu.fl.fedavg import recalibrate_bn, server_images
from scaleflu.link import MemoryChannel
from scaleflu.testbed.protocol import generate_keys
from testbed_helpers import base_config, closer, run_federation, three_robots

pytestmark = pytest.mark.timeout(300)


def _one_round(tmp_path: Path, recal: int) -> tuple[object, dict[str, torch.Tensor]]:
    cfg = base_config(
        "model.name=mobilenetv3",
        f"fl.bn_recalibration={recal}",
        "data.train_subset=600",
        "testbed.rounds=1",
        "testbed.round_deadline_s=60",
        "testbed.register_timeout_s=30",
        "testbed.unlearn.wait_s=1",
    )
    ch = MemoryChannel(seed=3, loss=0.0)
    server, robots = three_robots(ch.attach, generate_keys([1, 2, 3]), cfg, tmp_path)
    report, _ = run_federation(server, robots, 120, closer(server, robots, ch))
    assert [row["participants"] for row in report["rounds"]] == [[1, 2, 3]]
    return server, {k: v.clone() for k, v in server.global_state.items()}


def _recalibrated(server, state: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    data = server_images(server.setup.test, int(server.cfg.seed), k)
    return recalibrate_bn(server.setup.new_model(), state, data)


def test_server_recalibrates_batchnorm_statistics(tmp_path: Path) -> None:
    server, state = _one_round(tmp_path / "on", 40)
    assert server.bn_recal.active
    again = _recalibrated(server, state, 40)  # the same weights and images: the same statistics
    stats = [k for k in state if k.endswith(("running_mean", "running_var"))]
    assert stats
    for k in stats:
        torch.testing.assert_close(state[k], again[k], rtol=1e-4, atol=1e-6)

    off, plain = _one_round(tmp_path / "off", 0)
    assert not off.bn_recal.active
    recal = _recalibrated(off, plain, 40)
    assert any(not torch.allclose(plain[k], recal[k], rtol=1e-3, atol=1e-5) for k in stats)
