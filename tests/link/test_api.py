"""Link API over MemoryChannel: threaded ARQ delivering state dicts over lossy links."""

from __future__ import annotations

import threading
import time

import pytest

from scaleflu.link.api import DeliveryResult, LinkClosedError
from scaleflu.link.arq import SendStatus
from scaleflu.link.memory import MemoryChannel
from scaleflu.link.wire import Message, MessageType

FAST = {"rate_bytes_per_s": 3e6, "min_rto": 0.02, "initial_rto": 0.1}


@pytest.mark.parametrize("loss", [0.1, 0.2])
def test_lenet_both_ways_bit_exact(loss: float, make_lenet) -> None:  # noqa: ANN001
    with MemoryChannel(
        loss=loss,
        ber=1e-5,
        duplicate=0.02,
        reorder=0.02,
        delay=0.002,
        rate_bytes_per_s=4e6,
        seed=int(loss * 100),
    ) as ch:
        server = ch.attach(0, **FAST)
        robot = ch.attach(1, **FAST)
        sd_down = make_lenet(1)
        sd_up = make_lenet(2)
        results: list[DeliveryResult] = []
        up = threading.Thread(
            target=lambda: results.append(
                robot.send(0, Message(MessageType.UPDATE, tensors=sd_up, session=3), timeout=30)
            )
        )
        up.start()
        down = server.send(1, Message(MessageType.MODEL, tensors=sd_down, session=3), timeout=30)
        up.join(timeout=40)
        assert down.ok and results and results[0].ok, (down, results)
        src, msg = robot.recv_message(timeout=5)
        assert src == 0 and msg.type == MessageType.MODEL and msg.session == 3
        assert msg.sender == 0 and msg.receiver == 1
        assert all(msg.tensors[k].tobytes() == v.tobytes() for k, v in sd_down.items())
        src, msg = server.recv_message(timeout=5)
        assert src == 1 and msg.type == MessageType.UPDATE
        assert all(msg.tensors[k].tobytes() == v.tobytes() for k, v in sd_up.items())
        assert robot.recv(timeout=0.3) is None  # delivered exactly once
        stats = robot.stats()
        assert stats["arq"]["crc_errors"] + server.stats()["arq"]["crc_errors"] > 0
        assert down.retransmissions > 0


def test_deadline_to_absent_peer_is_unconfirmed_not_failed() -> None:
    # every fragment went out and nothing came back: the sender cannot know, so it says so
    with MemoryChannel(seed=0) as ch:
        a = ch.attach(1, initial_rto=0.05)
        t0 = time.monotonic()
        res = a.send(9, b"anyone?", timeout=0.4)
        assert res.status is SendStatus.UNCONFIRMED and res.reason == "deadline"
        assert not res.ok
        assert 0.35 <= time.monotonic() - t0 < 2.0


def test_close_fails_pending_and_refuses_new_sends() -> None:
    ch = MemoryChannel(loss=1.0, seed=0)
    a = ch.attach(1)
    ch.attach(2)
    h = a.send_async(2, b"x" * 100_000, timeout=60)  # 68 fragments, window 32: not all sent
    ch.close()
    assert h.wait(2.0) and h.status is SendStatus.FAILED and h.reason == "closed"
    with pytest.raises(LinkClosedError):
        a.send_async(2, b"y")
    with pytest.raises(LinkClosedError):
        a.recv(timeout=0.01)


def test_context_manager_and_recv_timeout() -> None:
    with MemoryChannel(seed=0) as ch, ch.attach(1) as a, ch.attach(2) as b:
        assert a.recv(timeout=0.05) is None
        assert b.send(1, b"ping", timeout=5).ok
        assert a.recv(timeout=1) == (2, b"ping")
    with pytest.raises(ValueError):
        MemoryChannel(model=ch.model, loss=0.1)


def test_receiving_from_tells_a_transfer_under_way() -> None:
    """A partial message from a peer shows as receiving_from(peer) until it completes."""
    from scaleflu.link.api import ArqLink

    frames: list[bytes] = []
    tx = ArqLink(1, frames.append, initial_rto=60.0)
    rx = ArqLink(0, lambda raw: None)
    try:
        payload = bytes(range(256)) * 80  # 20 kB: several frames
        tx.send_async(0, payload, timeout=120)
        deadline = time.monotonic() + 10
        while len(frames) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(frames) >= 2
        assert not rx.receiving_from(1)
        rx.feed(frames[0])
        assert rx.receiving_from(1) and not rx.receiving_from(2)
        for raw in frames[1:]:
            rx.feed(raw)
        got = rx.recv(timeout=5)
        assert got == (1, payload)
        assert not rx.receiving_from(1)
    finally:
        tx.close()
        rx.close()
