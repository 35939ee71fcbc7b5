"""Tensors through the OFDM loopback (AWGN, CFO, multipath) arrive bit-exact, also with loss."""

from __future__ import annotations

import numpy as np
import pytest

from scaleflu.link.wire import decode_tensors, encode_tensors
from scaleflu.linkkinds import open_link
from scaleflu.radio.links import OfdmLoopbackNetwork
from scaleflu.radio.phy import ChannelConfig

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(120)]

CHANNEL = dict(snr_db=20.0, cfo=0.002, taps=(1.0, 0.3 + 0.2j, 0.1j))


def _roundtrip(server, robot, sd, timeout=60.0):
    data = encode_tensors(sd)
    res = server.send(robot.node_id, data, timeout=timeout)
    assert res.ok, res
    got = robot.recv(timeout=10)
    assert got is not None
    src, raw = got
    assert src == server.node_id
    assert raw == data
    out = decode_tensors(raw)
    assert set(out) == set(sd)
    for k in sd:
        assert out[k].dtype == sd[k].dtype and np.array_equal(out[k], sd[k])
    return res


@pytest.mark.parametrize(
    "drop_rate, mcs", [(0.0, "stock"), (0.1, "stock"), (0.2, "stock"), (0.1, "adaptive")]
)
def test_lenet_state_dict_bit_exact(lenet_state_dict, drop_rate, mcs):
    """The paper's stock PHY (no CRC error at 20 dB with CFO and multipath) and the link kinds'
    default, the coded PHY adapting its MCS from the peer's ACKs (a lost frame now and then is
    the price of a faster MCS: the ARQ repairs it)."""
    net = f"t{drop_rate}{mcs}"
    server = open_link(
        "ofdm-loopback",
        0,
        network=net,
        nodes=(0, 1),
        drop_rate=drop_rate,
        seed=3,
        mcs=mcs,
        **CHANNEL,
    )
    robot = open_link("ofdm-loopback", 1, network=net)
    res = _roundtrip(server, robot, lenet_state_dict(int(drop_rate * 10)))
    counters = server.network.counters()
    if drop_rate:
        dropped = counters["0->1"]["dropped"] + counters["1->0"]["dropped"]
        assert dropped > 0 and res.retransmissions > 0
    # the uplink too, at the same time as nothing else: robot -> server
    _roundtrip(robot, server, lenet_state_dict(7))
    if mcs == "stock":
        assert counters["0->1"]["crc_errors"] == 0
    else:  # the ACKs took the sender off the most robust MCS
        sent = server.network.tx[0].frames_per_mcs()
        # frames above BPSK 1/2: more than half on a quiet machine; 160 of 428 (37 %) in a
        # whole-suite run on 2 loaded cores, where ARQ timers fire late and resend robustly
        faster = sum(n for m, n in sent.items() if m != "bpsk-1/2")
        assert faster >= 0.25 * sum(sent.values()), sent


def test_three_nodes_star_and_broadcast_filter(lenet_state_dict):
    with OfdmLoopbackNetwork(
        nodes=(0, 1, 2), topology="star", channel=ChannelConfig(snr_db=25.0, cfo=0.001)
    ) as net:
        s, r1, r2 = net.link(0), net.link(1), net.link(2)
        small = {"w": np.arange(3000, dtype=np.float32)}
        # two downlinks and an uplink at the same time
        h1 = s.send_async(1, encode_tensors(small), timeout=30)
        h2 = s.send_async(2, encode_tensors({"w": -np.arange(2000, dtype=np.float32)}), timeout=30)
        up = r1.send_async(0, encode_tensors({"u": np.ones(5000, np.float32)}), timeout=30)
        assert h1.wait(35) and h2.wait(35) and up.wait(35)
        assert {h.status.value for h in (h1, h2, up)} == {"delivered"}
        src, raw = s.recv(timeout=5)
        assert src == 1 and decode_tensors(raw)["u"].sum() == 5000
        assert np.array_equal(decode_tensors(r1.recv(timeout=5)[1])["w"], small["w"])
        assert decode_tensors(r2.recv(timeout=5)[1])["w"][1] == -1.0
        assert r1.recv(timeout=0.2) is None  # robot 1 never gets robot 2's message
        assert _roundtrip(r2, s, small).ok
        assert net.pairs() == [(0, 1), (0, 2), (1, 0), (2, 0)]
