"""A robot builds its data with the server's builder: canaries and lr schedules agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.fl.data import FASHION_MNIST_DIR, FASHION_MNIST_FILES
from scaleflu.fl.fedavg import LocalConfig
from scaleflu.testbed.protocol import client_of
from testbed_helpers import base_config

pytestmark = pytest.mark.skipif(
    not all((FASHION_MNIST_DIR / n).is_file() for n in FASHION_MNIST_FILES),
    reason="FashionMNIST not installed",
)


def test_robot_data_is_the_servers_partition_with_canaries() -> None:
    from scaleflu.fl.run import build_setup
    from scaleflu.testbed.robot import RobotData

    cfg = base_config(
        "data.poison.canary_clients=[0, 1]",
        "data.poison.canaries=5",
        "data.poison.canary_copies=3",
    )
    setup = build_setup(cfg)
    for r in (1, 2, 3):
        mine = RobotData(cfg, r)
        part = setup.parts[client_of(r)]
        assert np.array_equal(mine.part, part)
        assert torch.equal(mine.train.pixels, setup.train.subset(part).pixels)
        assert torch.equal(mine.train.labels, setup.train.subset(part).labels)
    # the canaries' extra copies (appended after the 1500 samples) are robots 1 and 2's only
    extra = len(setup.train) - 1500
    held = [int((RobotData(cfg, r).part >= 1500).sum()) for r in (1, 2, 3)]
    assert extra > 0 and held[0] > 0 and held[1] > 0 and held[2] == 0
    assert sum(held) == extra


def test_robot_trains_with_the_runs_lr_schedule() -> None:
    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.common import federation_config
    from scaleflu.testbed.protocol import generate_keys
    from scaleflu.testbed.robot import RobotClient, RobotData

    cfg = base_config("fl.lr_schedule=cosine", "fl.lr_min_ratio=0.1", "testbed.rounds=4")
    assert cfg.fl.rounds != 4  # the federation's T is testbed.rounds, on the server and robots
    keys = generate_keys([1])
    robot = RobotClient(MemoryChannel().attach(1), 1, keys[1], cfg, data=RobotData(cfg, 1))
    try:
        assert robot.local == LocalConfig.from_config(federation_config(cfg).fl)
        assert robot.local.lr_at(1) == pytest.approx(0.05)
        assert robot.local.lr_at(4) == pytest.approx(0.005)  # the floor at the last round
        assert robot.local.lr_at(2) > robot.local.lr_at(3) > 0.005
    finally:
        robot.link.close()
