"""Edge server and 3 robots on one shared frequency (frames-shared): MAC, broadcast downlink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scaleflu.config import load_config
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub
from scaleflu.linkkinds import open_link
from scaleflu.testbed.protocol import SERVER_ID, generate_keys, state_sha256
from scaleflu.testbed.transport import (
    pack_broadcast_body,
    unpack_broadcast_body,
)
from testbed_helpers import (
    TESTBED_OVERRIDES,
    closer,
    drop_broadcast_bodies,
    run_federation,
    three_robots,
)

pytestmark = pytest.mark.timeout(300)

RATE = 712500.0
OVERRIDES = [
    *TESTBED_OVERRIDES,
    "testbed.round_deadline_s=40",
    "testbed.register_timeout_s=30",
    "testbed.link=frames-shared",
]


def test_broadcast_body_is_checked_by_hash():
    sha, packed = pack_broadcast_body(b"model bytes")
    assert unpack_broadcast_body(packed) == (sha, b"model bytes")
    assert unpack_broadcast_body(packed[:-1] + b"X") is None  # hash mismatch
    assert unpack_broadcast_body(b"SFBC\x01short") is None
    assert unpack_broadcast_body(b"an envelope") is None


def _shared_link(hub: FrameHub, mac: dict[str, Any], node: int) -> Any:
    """Node ``node``'s frames-shared link on ``hub`` (the server lists robots 1-3)."""
    return open_link(
        "frames-shared",
        node,
        hub=hub.address,
        mac=mac,
        members=(1, 2, 3) if node == SERVER_ID else (),
        rate_bytes_per_s=RATE,
        seed=node,
    )


def test_three_robots_on_one_frequency_bit_exact_no_collision(tmp_path: Path):
    cfg: dict[str, Any] = load_config(None, OVERRIDES)
    hub = FrameHub(
        model=ChannelModel(rate_bytes_per_s=RATE, loss=0.02), shared=True, seed=int(cfg["seed"])
    )
    keys = generate_keys([1, 2, 3])
    mac = dict(cfg["testbed"]["mac"])

    def link(node: int):
        return _shared_link(hub, mac, node)

    server, robots = three_robots(link, keys, cfg, tmp_path)
    # collisions once every robot is registered (scheduled traffic only; joining contends)
    at_first_round: list[int] = []
    run_round = server.rounds.run_round

    def counting_round(t: int):
        if not at_first_round:
            at_first_round.append(hub.collided_frames)
        return run_round(t)

    server.rounds.run_round = counting_round

    report, outs = run_federation(server, robots, 150, closer(server, robots, hub))
    assert [row["participants"] for row in report["rounds"]] == [[1, 2, 3], [1, 2, 3]]
    un = report["unlearning"]
    assert all(un["bit_exact"].values()) and set(un["bit_exact"]) == {1, 2, 3}
    for r in (1, 2, 3):
        assert outs[r]["evals"]["unlearned"]["sha256"] == un["model_sha256"]
    assert hub.collided_frames - at_first_round[0] == 0, (at_first_round, hub.collided_frames)
    mac_stats = report["server_link"]["mac"]
    # every model went out as broadcasts: 2 rounds + "before" + "unlearned" deployments
    assert mac_stats["bcast_passes"] >= 4 and mac_stats["grants_tx"] > 10


def test_round_link_row_and_summary_columns():
    import io

    from scaleflu.testbed.report import print_summary
    from scaleflu.testbed.transport import round_link_row

    before = {"retransmissions": 3, "sched_bytes": 1000, "grants": 10, "grant_timeouts": 1}
    before.update(bcast_frames=0, bcast_repair_frames=0, bcast_bytes=0)
    after = {"retransmissions": 5, "sched_bytes": 3000, "grants": 30, "grant_timeouts": 2}
    after.update(bcast_frames=170, bcast_repair_frames=2, bcast_bytes=250_000)
    after["rate_bytes_per_s"] = 750_000.0
    row = round_link_row(before, after, air_bytes=748_000)
    assert row["retransmissions"] == 2 and row["grants"] == 20 and row["grant_timeouts"] == 1
    assert row["sched_bytes"] == 2000
    assert row["sched_overhead"] == pytest.approx(2000 / 1_000_000)
    assert row["airtime_s"] == pytest.approx(1_000_000 / 750_000)
    # a link without MAC: retransmissions only
    assert round_link_row({"retransmissions": 0}, {"retransmissions": 4}, 10) == {
        "retransmissions": 4
    }
    fh = io.StringIO()
    print_summary({"rounds": [{"round": 1, "participants": [1, 2], "link": row}]}, fh)
    text = fh.getvalue()
    assert "sched %" in text and " 1.33 " in text and "   0.2 " in text
    assert "unicast" not in text  # no broadcast downlink counted: no column
    fh = io.StringIO()
    rounds = [{"round": 1, "participants": [1, 2], "link": {**row, "unicast_fallbacks": 3}}]
    print_summary({"rounds": rounds}, fh)
    head, line = fh.getvalue().splitlines()[-2:]
    assert "unicast" in head and line.split()[-1] == "3"


def test_a_robot_the_broadcast_never_reaches_gets_the_model_by_unicast(tmp_path: Path):
    """Robot 2 loses every broadcast frame (its link drops them): its repair stalls, the server
    sends it the model by unicast, and every round closes with it, bit-exact, without a robot
    registering again (the rescue the idle timer used to provide)."""

    cfg: dict[str, Any] = load_config(
        None,
        [
            *OVERRIDES,
            "testbed.broadcast_stall_passes=3",
            "testbed.broadcast_stall_s=3",
            "testbed.unlearn.wait_s=8",
        ],
    )
    hub = FrameHub(model=ChannelModel(rate_bytes_per_s=RATE), shared=True, seed=int(cfg["seed"]))
    keys = generate_keys([1, 2, 3])
    mac = dict(cfg["testbed"]["mac"])
    dropped: list[int] = []

    def link(node: int):
        lk = _shared_link(hub, mac, node)
        if node == 2:  # robot 2 hears every frame but the broadcast DATA (model bodies)
            drop_broadcast_bodies(lk, dropped)
        return lk

    server, robots = three_robots(link, keys, cfg, tmp_path)

    report, outs = run_federation(server, robots, 150, closer(server, robots, hub))
    assert dropped  # the broadcasts were on air and robot 2 lost them
    rounds = report["rounds"]
    assert [row["participants"] for row in rounds] == [[1, 2, 3], [1, 2, 3]]
    assert all(row["missing"] == [] for row in rounds)
    assert [row["link"]["unicast_fallbacks"] for row in rounds] == [1, 1]  # robot 2, each round
    falls = [e for e in report["events"] if e["event"] == "broadcast_fallback"]
    assert {e["robot"] for e in falls} == {2}
    assert [e["purpose"] for e in falls][:2] == ["train", "train"]
    assert report["unicast_fallbacks"] == len(falls) >= 3  # + the deployments after unlearning
    assert report["server_link"]["mac"]["bcast_abandoned"] == len(falls)
    # no robot registered again: the round did not need the idle timer's rescue
    assert all(v["registrations"] == 1 for v in report["robots"].values())
    assert all(outs[r]["registrations"] == 1 and outs[r]["idle_reregistrations"] == 0 for r in outs)
    # robot 2 trained each round once, from exactly the server's global model of that round
    for t in (1, 2):
        g = {k: v.numpy() for k, v in server.history.global_model(t).items()}
        assert outs[2]["rounds"][t - 1]["model_sha256"] == state_sha256(g)
    assert [x["round"] for x in outs[2]["rounds"]] == [1, 2]
    assert all(x["upload"] == "delivered" for x in outs[2]["rounds"])
    un = report["unlearning"]
    assert all(un["bit_exact"].values()) and set(un["bit_exact"]) == {1, 2, 3}
