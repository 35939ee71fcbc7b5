"""Models sent on the broadcast downlink (frames-shared, the demo's link) carry the server's
signature like unicast ones: robots enrolled with the server's public key accept them on the
first attempt (before, every broadcast model was refused as unsigned and each round waited for
its deadline, then went out again by unicast)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scaleflu.config import load_config
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub
from scaleflu.linkkinds import open_link
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.robot import RobotClient
from scaleflu.testbed.server import EdgeServer
from testbed_helpers import run_federation

pytestmark = pytest.mark.timeout(300)
RATE = 712500.0
DEADLINE = 60


def test_broadcast_models_are_signed_and_accepted_first_time(tmp_path: Path):
    cfg: dict[str, Any] = load_config(
        None,
        [
            "data.num_clients=3", "fl.clients_per_round=3", "data.train_subset=900",
            "data.test_subset=300", "fl.local_epochs=1", "testbed.rounds=2",
            f"testbed.round_deadline_s={DEADLINE}", "testbed.register_timeout_s=30",
            "testbed.unlearn.wait_s=0", "testbed.eval_test_samples=50", "testbed.min_robots=3",
            "testbed.link=frames-shared",
        ],
    )  # fmt: skip
    hub = FrameHub(model=ChannelModel(rate_bytes_per_s=RATE), shared=True, seed=0)
    store = KeyStore.create([1, 2, 3])
    mac = dict(cfg["testbed"]["mac"])

    def link(node: int):
        return open_link(
            "frames-shared", node, hub=hub.address, mac=mac,
            members=(1, 2, 3) if node == SERVER_ID else (), rate_bytes_per_s=RATE, seed=node,
        )  # fmt: skip

    server = EdgeServer(
        link(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
    )
    robots = [
        RobotClient(link(r), r, store.robots[r], cfg, server_public_key=store.public_key)
        for r in (1, 2, 3)
    ]

    def close() -> None:
        for rb in robots:
            rb.link.close()
        server.link.close()
        hub.close()

    report, outs = run_federation(server, robots, 150, close)
    assert [row["participants"] for row in report["rounds"]] == [[1, 2, 3], [1, 2, 3]]
    assert not [e for e in report["events"] if e["event"] == "round_failed"]
    assert all(row["wall_s"] < DEADLINE for row in report["rounds"])
    assert report["server_link"]["mac"]["bcast_passes"] >= 2  # the models went by broadcast
    for r in (1, 2, 3):
        assert not [x for x in outs[r]["rejects"] if x.get("reason") == "bad_signature"], r
        assert [x["round"] for x in outs[r]["rounds"]] == [1, 2]
