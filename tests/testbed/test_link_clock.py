"""Waits on the link's clock: a medium slower than the wall (ofdm-shared's virtual time) must not
make a robot give up on a live server, nor the server stop waiting for robots too early."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from scaleflu.link import MemoryChannel
from scaleflu.testbed.common import (
    LinkDeadline,
    arrays,
    encode_state,
    install_link_keys,
    wait_on_clock,
)
from scaleflu.testbed.protocol import SERVER_ID, generate_keys, state_sha256
from scaleflu.testbed.robot import RobotClient, RobotData
from scaleflu.testbed.server import EdgeServer
from testbed_helpers import base_config

pytestmark = pytest.mark.timeout(240)


class ClockedLink:
    """A link with a ``virtual_time`` of its own, as the shared medium's links have: ``rate`` x
    the wall (a busy medium runs at about 0.1 x), plus whatever ``advance`` adds."""

    def __init__(self, inner: Any, rate: float) -> None:
        self._inner = inner
        self.rate = rate
        self._t0 = time.monotonic()
        self._extra = 0.0

    def virtual_time(self) -> float:
        return (time.monotonic() - self._t0) * self.rate + self._extra

    def advance(self, seconds: float) -> None:
        self._extra += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture(scope="module")
def cfg():
    return base_config("testbed.robot_idle_s=0.5", "testbed.send_timeout_s=20")


@pytest.fixture(scope="module")
def data1(cfg) -> RobotData:
    return RobotData(cfg, 1)


def _idle_robot(cfg, data1, rate: float) -> tuple[RobotClient, list[float], MemoryChannel]:
    """Robot 1 on a link whose clock runs at ``rate`` x the wall, and a server that never
    speaks; registration is stubbed (it succeeds at once) and counted."""
    ch = MemoryChannel(seed=1)
    keys = generate_keys([1])
    link = ClockedLink(ch.attach(1), rate)
    robot = RobotClient(link, 1, keys[1], cfg, data=data1)
    calls: list[float] = []

    def register(timeout: float = 60.0) -> bool:
        calls.append(time.monotonic())
        robot.session = 7
        return True

    robot.register = register  # type: ignore[method-assign]
    return robot, calls, ch


def test_robot_idle_timer_runs_on_the_link_clock(cfg, data1):
    """robot_idle_s = 0.5 s: over 3 s of wall time a link clock at 0.01 x the wall moves 0.03 s,
    so the robot does not register again; at 1 x it does, every ~0.5 s."""
    slow, calls, ch = _idle_robot(cfg, data1, rate=0.01)
    out = slow.run(max_runtime=3.0)
    ch.close()
    assert len(calls) == 1 and out["idle_reregistrations"] == 0
    fast, calls, ch = _idle_robot(cfg, data1, rate=1.0)
    out = fast.run(max_runtime=3.0)
    ch.close()
    assert out["idle_reregistrations"] >= 2 and len(calls) == 1 + out["idle_reregistrations"]


def test_link_deadline_follows_a_slow_clock_and_stops_on_a_frozen_one():
    now = [0.0]
    d = LinkDeadline(0.3, lambda: now[0])
    time.sleep(0.2)
    now[0] = 0.1  # the clock moves, slowly: the deadline waits for it
    time.sleep(0.3)
    assert not d.expired()
    now[0] = 0.31
    assert d.expired()
    frozen = LinkDeadline(0.3, lambda: 5.0)  # a medium that never steps (a node never joined)
    assert not frozen.expired()
    time.sleep(0.35)
    assert frozen.expired()  # the wall backstop

    class Never:
        def done(self) -> bool:
            return False

        def wait(self, timeout: float) -> bool:
            time.sleep(timeout)
            return False

    assert wait_on_clock(Never(), 0.3, lambda: 1.0) is False  # frozen clock: returns anyway


def test_the_same_model_again_does_not_train_the_round_twice(cfg, data1):
    """A unicast fall-back and the broadcast envelope it replaced are one send (same send_id):
    the robot trains round t from it once; another send of round t (the server retrying the
    round, a new send_id) is trained again, as is a send without an id."""
    ch = MemoryChannel(seed=2)
    keys = generate_keys([1])
    server_link = ch.attach(SERVER_ID)  # its ARQ acknowledges the upload
    install_link_keys(server_link, keys, SERVER_ID)
    robot = RobotClient(ch.attach(1), 1, keys[1], cfg, data=data1)
    robot.session = 9
    state = arrays(robot.model.state_dict())

    def model(st: dict[str, np.ndarray]) -> tuple[dict[str, Any], bytes]:
        meta = {"purpose": "train", "sha256": state_sha256(st), "deadline_s": 30.0, "send_id": 4}
        return meta, encode_state(st)

    meta, body = model(state)
    # the broadcast envelope came first and waits for its body; the unicast supersedes it
    robot._waiting_body = {"ab" * 32: (1, {**meta, "body_sha256": "ab" * 32}, b"")}
    robot._on_model(1, meta, body)
    assert robot._waiting_body == {}
    assert [r["upload"] for r in robot.rounds] == ["delivered"]
    robot._on_model(1, meta, body)  # the same send again: not trained twice
    assert len(robot.rounds) == 1
    robot._on_model(1, {**meta, "send_id": 5}, body)  # the round retried: trained again
    assert len(robot.rounds) == 2
    robot._on_model(1, {k: v for k, v in meta.items() if k != "send_id"}, body)
    assert len(robot.rounds) == 3
    assert all(r["upload"] == "delivered" for r in robot.rounds)
    server_link.close()
    ch.close()


def test_server_waits_for_robots_on_the_link_clock(cfg, tmp_path):
    """register_timeout_s runs on the link's clock: after 1 s of wall time with the clock
    moving at 0.001 x the wall, the server still waits; once the clock passes, it gives up."""
    ch = MemoryChannel(seed=3)
    link = ClockedLink(ch.attach(SERVER_ID), rate=0.001)
    server = EdgeServer(link, generate_keys([1, 2, 3]), cfg, tmp_path, False)
    got: list[bool] = []
    th = threading.Thread(target=lambda: got.append(server.sessions.wait_for_robots(3, 0.5)))
    th.start()
    time.sleep(1.0)
    assert th.is_alive() and not got
    link.advance(1.0)
    th.join(60)
    assert got == [False]
    link.close()
    ch.close()


def test_a_slow_register_ack_is_retried_with_the_same_nonce(cfg, data1):
    """A REGISTER_ACK slower than the retry interval: the retry repeats the same nonce, which
    the server acknowledges without registering again (a new nonce per retry registered the
    robot twice on the medium, and the server then reset what it held and sent the model
    again)."""
    ch = MemoryChannel(seed=5)
    keys = generate_keys([1])
    link = ClockedLink(ch.attach(1), rate=20.0)  # 4 s of the link's clock in 0.2 s of wall
    robot = RobotClient(link, 1, keys[1], cfg, data=data1)
    sent: list[str | None] = []
    robot._send_register = lambda timeout: sent.append(robot._pending_nonce)  # type: ignore[method-assign]
    assert robot.register(timeout=20.0) is False  # no server: every attempt times out
    ch.close()
    assert len(sent) >= 3 and len(set(sent)) == 1 and sent[0]
