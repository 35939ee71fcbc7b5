"""Transports: no ZeroMQ identity takeover at the frame hub; local binding by default."""

from __future__ import annotations

import inspect
import time

import pytest

zmq = pytest.importorskip("zmq")

from scaleflu.link.hub import FrameHub, FrameHubLink  # noqa: E402


def test_frame_hub_refuses_a_second_connection_with_a_nodes_identity():
    hub = FrameHub("tcp://127.0.0.1:0")
    a = FrameHubLink(0, hub.address)
    b = FrameHubLink(1, hub.address)
    thief = zmq.Context.instance().socket(zmq.DEALER)
    thief.setsockopt(zmq.IDENTITY, b"R\x00\x01")  # robot 1's receive identity
    thief.setsockopt(zmq.LINGER, 0)
    try:
        time.sleep(0.5)
        thief.connect(hub.address)
        for _ in range(5):
            thief.send(b"")  # keep-alives, as a node's receive socket sends them
            time.sleep(0.1)
        assert a.send(1, b"for robot 1 only", timeout=15).ok
        got = b.recv(5.0)
        assert got == (0, b"for robot 1 only")
        assert thief.poll(500) == 0  # the thief received nothing
    finally:
        thief.close(0)
        a.close()
        b.close()
        hub.close()


def test_zmq_ofdm_link_binds_localhost_by_default():
    links = pytest.importorskip("scaleflu.radio.links")
    sig = inspect.signature(links.ZmqOfdmLink.__init__)
    assert sig.parameters["bind"].default == "127.0.0.1"
