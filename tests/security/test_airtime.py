"""What an enrolled robot can make the edge server send in a minute is bounded, whatever it
sends: registration storms (a new nonce each time), RESYNC storms, challenge requests, or all
of them mixed, during an open round. The server runs on a link clock ten times faster than the
wall (as the shared medium's virtual clock would be, only faster), so a minute of the
server's airtime window passes in six seconds.

Before, every REGISTER made the server forget what the robot held and send the round's full
model again: a robot re-registering drew megabytes per minute for a few hundred bytes sent.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import pytest

from scaleflu.config import load_config
from scaleflu.link import MemoryChannel
from scaleflu.link.mcs import MCS_TABLE_VERSION
from scaleflu.testbed.common import arrays, encode_state
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID, MsgType
from scaleflu.testbed.robot import RobotClient, RobotData
from scaleflu.testbed.server import EdgeServer

pytestmark = pytest.mark.timeout(300)

SPEED = 10.0  # the server's clock runs this many times faster than the wall
WINDOW_S = 60.0  # testbed.airtime.window_s (default)
CONTROL = 64 * 1024  # default budget besides 2 full models


def _fast_clock(link: Any) -> Any:
    t0 = time.monotonic()
    link.virtual_time = lambda: (time.monotonic() - t0) * SPEED
    return link


def _storm(robot: RobotClient, kind: str, stop: threading.Event) -> int:
    """Send ``kind`` requests as fast as the link takes them until ``stop``; returns how many."""
    n = 0
    while not stop.is_set():
        k = kind if kind != "mixed" else ("register", "resync", "hello")[n % 3]
        s = robot.session or 0
        if k == "register":
            meta = {
                "nonce": secrets.token_hex(8),
                "num_samples": len(robot.data),
                "mcs_table": MCS_TABLE_VERSION,
            }
            robot.ep.send(MsgType.REGISTER, SERVER_ID, robot.key, s, 0, meta, timeout=5.0)
        elif k == "old":  # REGISTERs of older software (no MCS table): refused, answered
            meta = {"nonce": secrets.token_hex(8), "num_samples": len(robot.data)}
            robot.ep.send(MsgType.REGISTER, SERVER_ID, robot.key, s, 0, meta, timeout=5.0)
        elif k == "resync":
            robot.ep.send(MsgType.RESYNC, SERVER_ID, robot.key, s, 1, {}, timeout=5.0)
        else:  # a session-0 REGISTER asks for the server's challenge
            meta = {
                "nonce": secrets.token_hex(8),
                "num_samples": len(robot.data),
                "mcs_table": MCS_TABLE_VERSION,
            }
            robot.ep.send(MsgType.REGISTER, SERVER_ID, robot.key, 0, 0, meta, timeout=5.0)
        n += 1
        while robot.link.recv(0.0) is not None:  # read what the server answers, act on none
            pass
        time.sleep(0.002)
    return n


def _storm_run(tmp_path: Any, kind: str, *extra: str) -> tuple[Any, EdgeServer, int, float]:
    """The server with robot 2 storming its open round; (report, server, requests sent, the
    storm's duration in minutes of the server's clock)."""
    cfg = load_config(
        None,
        [
            "data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=400",
            "data.test_subset=100", "testbed.rounds=1", "testbed.max_round_retries=0",
            f"testbed.round_deadline_s={WINDOW_S}", "testbed.register_timeout_s=300",
            "testbed.unlearn.wait_s=0", "testbed.min_robots=1", *extra,
        ],
    )  # fmt: skip
    store = KeyStore.create([2])
    with MemoryChannel(seed=1) as ch:
        server = EdgeServer(
            _fast_clock(ch.attach(SERVER_ID)), store.robots, cfg, tmp_path, False,
            signing_key=store.signing_key,
        )  # fmt: skip
        robot = RobotClient(
            ch.attach(2), 2, store.robots[2], cfg, data=RobotData(cfg, 2),
            server_public_key=store.public_key,
        )  # fmt: skip
        stop = threading.Event()
        sent, start, joined = [0], [0.0], [False]

        def robot_side() -> None:  # it joins honestly, then storms the open round
            joined[0] = robot.register(timeout=60)
            if joined[0]:
                start[0] = server.clock()
                sent[0] = _storm(robot, kind, stop)

        storm = threading.Thread(target=robot_side)
        storm.start()
        try:  # the server runs in the thread that made it (its SQLite history)
            report = server.run()
        finally:
            stop.set()
            storm.join(30)
        assert joined[0], "robot 2 did not register"
        minutes = (server.clock() - start[0]) / 60.0
    return report, server, sent[0], minutes


@pytest.mark.parametrize("kind", ["register", "old", "resync", "hello", "mixed"])
def test_a_robot_cannot_draw_more_than_its_airtime_budget_per_minute(tmp_path, kind):
    report, server, sent, minutes = _storm_run(tmp_path, kind)
    full = len(encode_state(arrays(server.global_state))) + 1024  # a full MODEL envelope
    budget = 2 * full + CONTROL  # testbed.airtime.bytes null: 2 full models + 64 KiB
    drawn = server.sessions.ep.sent_bytes  # every envelope the server sent: all to robot 2
    scheduled = full + 4096  # the round's model, the challenge it announced, the BYE
    # a full bucket, then its refill over the time the storm lasted (about one window)
    bound = scheduled + budget * (1.0 + max(minutes, 1.0))
    assert sent > 50, "the storm did not run"
    assert drawn <= bound, (drawn, bound, sent)
    assert report["airtime"]["bytes_per_window"] == budget
    assert report["airtime"]["robots"][2]["charged_bytes"] <= budget * (1.0 + max(minutes, 1.0))


@pytest.mark.parametrize("kind", ["register", "old"])
def test_requests_beyond_the_budget_are_throttled_and_counted(tmp_path, kind):
    """Accepted and refused (another MCS table) REGISTERs alike are answered within the budget."""
    report, server, sent, minutes = _storm_run(tmp_path, kind, "testbed.airtime.bytes=20000")
    air = report["airtime"]["robots"][2]
    assert air["throttled"] > 0 and air["by_request"]["REGISTER"] == air["throttled"]
    # a full bucket, then its refill over the time the storm lasted (more than one window on a
    # loaded machine: 40062 bytes once, the storm having run past its minute)
    assert air["charged_bytes"] <= 20000 * (1.0 + max(minutes, 1.0))
    counts = [e["count"] for e in report["events"] if e["event"] == "throttled"]
    assert counts and counts == [2**i for i in range(len(counts))]  # logged sparsely
    # a throttled REGISTER registers nothing: only those answered count
    assert report["robots"][2]["registrations"] < sent
