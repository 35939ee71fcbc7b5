"""The server-scheduled MAC, the broadcast downlink and the frame-level medium (link.mac/macsim)."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from scaleflu.link import ArqConfig, ArqEndpoint, encode_tensors
from scaleflu.link.frame import BROADCAST
from scaleflu.link.mac import (
    BcastStatus,
    MacConfig,
    MacFrameError,
    MacServer,
    MacStation,
    MacType,
    decode_mac,
    encode_mac,
    mac_on_air,
)
from scaleflu.link.mac.frames import _grant_body, _parse_report, _report_body
from scaleflu.link.macsim import MacSim, simulate_round

LENET_PARAMS = 61706  # LeNet-5 as in scaleflu.link.samples.LENET_SHAPES
LENET_BYTES = len(encode_tensors({"w": np.zeros(LENET_PARAMS, dtype=np.float32)}))


# -- control frames are checked like any input from the air ------------------------------------


def test_mac_frame_round_trip_and_hostile_input():
    body = _grant_body(7, 4096, [(11, 168), (12, 3)])
    raw = encode_mac(MacType.GRANT, 0, 5, body)
    f = decode_mac(raw)
    assert (f.type, f.src, f.dst, f.body) == (MacType.GRANT, 0, 5, body)
    bad_crc = raw[:-1] + bytes([raw[-1] ^ 1])
    for junk in (raw[:5], bad_crc, raw + b"x", b"SM" + b"\x01" + raw[3:], b"SM\x03" + raw[3:]):
        with pytest.raises(MacFrameError):
            decode_mac(junk)
    with pytest.raises(MacFrameError):  # unknown type
        decode_mac(encode_mac(MacType.GRANT, 0, 5, body)[:3] + b"\x09" + raw[4:])
    items = [BcastStatus(11, 20, False, b"\xff\x0f\x00"), BcastStatus(12, 3, True, b"")]
    rep = _report_body(7, 123, items)
    r = _parse_report(rep)
    seq, backlog, got = r.seq, r.backlog, r.items
    assert (seq, backlog) == (7, 123)
    assert got[0].missing() == [8, 9, 10, 11] + list(range(16, 20))
    assert got[1].complete and got[1].missing() == []
    for bad in (
        rep[:-1],  # truncated bitmap... of the second item's header
        rep + b"\x00",  # trailing
        struct.pack(">IIHhB", 1, 0, 0, -32768, 200),  # too many items
        struct.pack(">IIHhB", 1, 0, 0, -32768, 1)
        + struct.pack(">IIBH", 1, 8, 0, 5)
        + b"\x00" * 5,  # > count
    ):
        with pytest.raises(MacFrameError):
            _parse_report(bad)


def test_server_survives_garbage_and_forged_reports():
    sim = MacSim(MacConfig(contention_slots=0))
    ep = ArqEndpoint(0, lambda raw: None, clock=sim.clock)
    srv = MacServer(ep, sim.transmitter(0), sim.config, members=[1, 2])
    rng = random.Random(1)
    for _ in range(200):
        junk = b"SM" + rng.randbytes(rng.randrange(0, 40))
        srv.on_frame(mac_on_air(junk, 1, 0))  # a good carrier frame, garbage inside
        srv.on_frame(junk)  # not even a link frame: the ARQ counts it
        srv.on_frame(mac_on_air(junk, 1, 0)[:-1])  # carrier CRC broken
    # a well-formed REPORT from a robot that is not a member is ignored, not trusted
    srv.on_frame(mac_on_air(encode_mac(MacType.REPORT, 9, 0, _report_body(1, 10**6, [])), 9, 0))
    # a REPORT whose MAC addresses differ from its carrier's is refused
    srv.on_frame(mac_on_air(encode_mac(MacType.REPORT, 1, 0, _report_body(1, 5, [])), 2, 0))
    assert 9 not in srv.members and srv.stats.reports_rx == 0
    assert srv.stats.bad_frames >= 400
    assert ep.stats.bad_frames + ep.stats.crc_errors >= 190
    with pytest.raises(ValueError, match="not members"):
        srv.broadcast(b"x" * 100, [1, 3])


# -- the medium ----------------------------------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def on_frame(self, raw: bytes) -> None:
        self.got.append(raw)

    def poll(self) -> None:
        pass

    def next_deadline(self) -> None:
        return None


def _link_frame(src: int, dst: int, n: int) -> bytes:
    from scaleflu.link.frame import encode_frame

    return encode_frame(0, src, dst, 1, 0, 1, bytes([src]) * n)


@pytest.mark.parametrize(("gain_db", "captured"), [(0.0, False), (10.0, True)])
def test_two_unscheduled_overlapping_frames_collide_unless_captured(gain_db, captured):
    sim = MacSim(MacConfig(), capture_db=6.0)
    sink = _Sink()
    for n in (0, 1, 2):
        sim.add(n, sink if n == 0 else _Sink())
    sim.set_link(1, 0, gain_db=gain_db)  # robot 1 is gain_db stronger at the server
    sim.transmitter(1)(_link_frame(1, 0, 1000))
    sim.now = 0.3e-3  # robot 2 starts while robot 1 is still on air
    sim.transmitter(2)(_link_frame(2, 0, 1000))
    while sim.step():
        pass
    assert sim.stats.collided_frames == 2
    if captured:
        assert [f[4:6] for f in sink.got] == [b"\x00\x01"]
        assert sim.stats.captured == 1 and sim.stats.lost_collision == 1
    else:
        assert sink.got == [] and sim.stats.lost_collision == 2


def test_frames_that_do_not_overlap_or_use_other_frequencies_do_not_collide():
    sim = MacSim(MacConfig())
    sink = _Sink()
    sim.add(0, sink, rx_freqs={0.0, 1.0})  # an FDMA server listens on both
    sim.add(1, _Sink(), freq=0.0)
    sim.add(2, _Sink(), freq=1.0)
    sim.transmitter(1)(_link_frame(1, 0, 1000))
    sim.transmitter(2)(_link_frame(2, 0, 1000))  # same time, other frequency
    sim.now = 0.01
    sim.transmitter(1)(_link_frame(1, 0, 1000))  # after the first one ended
    while sim.step():
        pass
    assert len(sink.got) == 3 and sim.stats.collided_frames == 0


# -- the MAC in FL rounds --------------------------------------------------------------------


def test_scheduled_round_three_robots_bit_exact_without_collision():
    r = simulate_round("scheduled", 3, LENET_BYTES, seed=3)
    assert r["all_updates"] and r["models_bit_exact"] == 3 and r["updates_bit_exact"] == 3
    assert r["collided_frames"] == 0 and r["lost_collision"] == 0
    assert r["broadcast"]["passes"] == 1 and r["broadcast"]["confirmed"] == [1, 2, 3]
    # the model went on air once for the three robots
    assert r["airtime_s"]["downlink"] == pytest.approx(r["model_own_airtime_s"])
    assert r["airtime_s"]["uplink"] <= 1.15 * r["updates_own_airtime_s"]


def test_unscheduled_round_on_one_frequency_collides():
    r = simulate_round("unscheduled", 3, LENET_BYTES, seed=3)
    assert r["collided_frames"] > 0 and r["lost_collision"] > 0
    assert r["retransmissions_on_air"] > 0
    ideal = simulate_round("per-pair", 3, LENET_BYTES, seed=3)
    assert ideal["collided_frames"] == 0 and ideal["retransmissions_on_air"] == 0
    assert r["closed_s"] > ideal["closed_s"]


def test_broadcast_repair_delivers_to_a_robot_that_missed_frames():
    sim_kw = {"seed": 5, "deadline_s": 60.0}
    clean = simulate_round("scheduled", 3, LENET_BYTES, **sim_kw)
    lossy = simulate_round("scheduled", 3, LENET_BYTES, loss=0.1, **sim_kw)
    assert lossy["lost_link"] > 0
    assert lossy["broadcast"]["passes"] >= 2 and lossy["broadcast"]["confirmed"] == [1, 2, 3]
    assert lossy["models_bit_exact"] == 3 and lossy["updates_bit_exact"] == 3
    count = lossy["broadcast"]["count"]
    repairs = lossy["mac"]["bcast_repair_frames"]
    # one repair broadcast carries the union of the gaps: far fewer than resending per robot
    assert 0 < repairs < count
    assert clean["mac"]["bcast_repair_frames"] == 0


def _bcast_sim() -> tuple[MacSim, MacServer, dict[int, bytes]]:
    """A server and joined robots 1, 2 in MacSim; ``got`` collects each robot's first message."""
    cfg = MacConfig(contention_slots=0)
    sim = MacSim(cfg)
    arq = ArqConfig(window=64)
    srv = MacServer(
        ArqEndpoint(0, lambda raw: None, clock=sim.clock, config=arq),
        sim.transmitter(0),
        cfg,
        members=[1, 2],
    )
    sim.add(0, srv)
    got: dict[int, bytes] = {}
    for r in (1, 2):
        ep = ArqEndpoint(
            r,
            lambda raw: None,
            clock=sim.clock,
            config=arq,
            on_message=lambda s, p, r=r: got.setdefault(r, p),
        )
        sim.add(r, MacStation(ep, sim.transmitter(r), cfg, joined=True))
    return sim, srv, got


def test_broadcast_repair_targets_exactly_the_union_of_missing_fragments():
    sim, srv, got = _bcast_sim()
    drop = {(1, 3), (1, 7), (2, 7), (2, 20)}  # (robot, fragment) lost on the first pass
    orig = sim._deliver

    def deliver(tx):
        if tx.dst == BROADCAST and tx.category == "downlink" and srv._bcasts:
            seq = struct.unpack_from(">I", tx.raw, 12)[0]
            b = next(iter(srv._bcasts.values()))
            if b.h.passes == 1:
                for r in (1, 2):
                    if (r, seq) in drop:
                        sim.set_link(0, r, loss=1.0)
                orig(tx)
                for r in (1, 2):
                    sim.set_link(0, r, loss=0.0)
                return
        orig(tx)

    sim._deliver = deliver
    payload = random.Random(0).randbytes(30 * 1474)
    h = sim.call(0, lambda: srv.broadcast(payload, [1, 2], deadline=30.0))
    sim.run_until(h.done, max_time=30.0)
    assert h.ok and got == {1: payload, 2: payload}
    assert h.passes == 2 and srv.stats.bcast_repair_frames == 3  # fragments 3, 7, 20


def test_robot_that_never_answers_its_grant_does_not_stall_the_round():
    deadline = 30.0
    r = simulate_round("scheduled", 3, LENET_BYTES, out_of_range=(2,), deadline_s=deadline)
    assert not r["all_updates"] and r["updates_in"] == [1, 3]
    assert r["closed_s"] == pytest.approx(deadline)
    assert r["updates_bit_exact"] == 2 and max(r["update_s"].values()) < 10.0
    # grants to the silent robot back off: a few timeouts, not one per scheduling slot
    assert 1 <= r["mac"]["grant_timeouts"] <= 12


def test_robots_transmit_nothing_without_a_grant():
    cfg = MacConfig(contention_slots=0)
    sim = MacSim(cfg)
    sim.add(0, ArqEndpoint(0, sim.transmitter(0), clock=sim.clock))  # a server without MAC
    ep = ArqEndpoint(1, lambda raw: None, clock=sim.clock)
    st = MacStation(ep, sim.transmitter(1), cfg, joined=True)
    sim.add(1, st)
    sim.call(1, lambda: ep.send(0, b"u" * 20000))
    sim.run_until(lambda: False, max_time=10.0)
    assert sim.stats.frames == 0 and st.backlog > 20000


def test_registration_is_contention_based_and_everyone_gets_in():
    r = simulate_round("scheduled", 10, 20000, register=True, seed=2)
    reg = r["register"]
    assert reg["ok"] and len(reg["join_attempts"]) == 10
    assert r["all_updates"] and r["collided_frames"] == 0  # the round itself is scheduled


def test_downlink_airtime_does_not_grow_with_robots():
    a = simulate_round("scheduled", 3, LENET_BYTES)
    b = simulate_round("scheduled", 10, LENET_BYTES)
    assert b["collided_frames"] == 0 and b["all_updates"]
    assert b["airtime_s"]["downlink"] == pytest.approx(a["airtime_s"]["downlink"], rel=0.10)
    unicast = simulate_round("per-pair", 10, LENET_BYTES)
    assert unicast["airtime_s"]["downlink"] > 9 * b["airtime_s"]["downlink"]


def test_simulate_round_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        simulate_round("aloha", 3, 1000)
    with pytest.raises(ValueError, match="robot"):
        simulate_round("scheduled", 0, 1000)
    with pytest.raises(ValueError):
        MacConfig(rate_bytes_per_s=0)


def test_the_mac_turns_off_time_based_loss_detection_of_its_endpoint() -> None:
    # frames wait in the MAC's queue for a grant: an ACK one RTT after the ARQ handed a frame
    # over does not prove it lost (ArqConfig.rack_rtt, on for endpoints without a MAC)
    for make in (
        lambda ep: MacServer(ep, lambda raw: None, MacConfig(), members=[1]),
        lambda ep: MacStation(ep, lambda raw: None, MacConfig(), joined=True),
    ):
        ep = ArqEndpoint(1, lambda raw: None, config=ArqConfig(window=16))
        assert ep.config.rack_rtt
        make(ep)
        assert not ep.config.rack_rtt and ep.config.window == 16


def _bcast_sim_dropping(robot: int):
    """:func:`_bcast_sim`, with every broadcast DATA frame to ``robot`` lost."""
    sim, srv, got = _bcast_sim()
    orig = sim._deliver

    def deliver(tx):
        if tx.dst == BROADCAST and tx.category == "downlink":
            sim.set_link(0, robot, loss=1.0)
            orig(tx)
            sim.set_link(0, robot, loss=0.0)
            return
        orig(tx)

    sim._deliver = deliver
    return sim, srv, got


def test_a_stalled_broadcast_target_is_reported_and_handed_over():
    """A robot that never receives the broadcast makes no progress: after N repair passes it is
    stalled (the others are not); abandoning it ends the broadcast for the rest, delivered."""
    sim, srv, got = _bcast_sim_dropping(2)
    payload = random.Random(1).randbytes(30 * 1474)
    h = sim.call(0, lambda: srv.broadcast(payload, [1, 2], deadline=60.0))
    assert h.stalled(2, sim.clock(), 1, 5.0) is None  # no repair pass yet, 5 s not passed
    sim.run_until(lambda: h.passes_since.get(2, 0) >= 3, max_time=30.0)
    now = sim.clock()
    assert not h.done() and h.confirmed == {1} and got == {1: payload}
    why = h.stalled(2, now, 3, 1e9)
    assert why is not None and "3 repair passes without progress" in why and "0/" in why
    assert h.stalled(2, now, 100, 1e9) is None  # neither bound reached
    assert h.stalled(2, now, 100, 0.0) is not None  # the time bound alone
    assert h.stalled(1, now, 1, 0.0) is None  # confirmed: never stalled
    h.abandon(2)
    sim.run_until(h.done, max_time=now + 5.0)
    assert h.ok and h.reason == "delivered" and h.abandoned == {2} and 2 not in h.confirmed
    assert srv.stats.bcast_abandoned == 1
    assert h.stalled(2, sim.clock(), 1, 0.0) is None  # handed over: no longer the MAC's


def test_without_hand_over_a_starved_target_keeps_the_broadcast_to_its_deadline():
    sim, srv, got = _bcast_sim_dropping(2)
    payload = random.Random(2).randbytes(10 * 1474)
    h = sim.call(0, lambda: srv.broadcast(payload, [1, 2], deadline=8.0))
    sim.run_until(h.done, max_time=20.0)
    assert h.reason == "deadline" and not h.ok and h.confirmed == {1}
    assert h.passes > 3 and h.received.get(2, 0) == 0 and h.received[1] == h.count


def test_repair_passes_count_only_against_a_target_heard_from_after_them():
    """Robot 1 receives the broadcast but none of its REPORTs reach the server (uplink lost);
    robot 2 reports every gap. Passes count against robot 2 only: robot 1 may hold everything,
    it was just not heard (only the time bound applies to it)."""
    sim, srv, got = _bcast_sim_dropping(2)
    sim._loss[(1, 0)] = 1.0  # robot 1 -> server only
    payload = random.Random(3).randbytes(20 * 1474)
    h = sim.call(0, lambda: srv.broadcast(payload, [1, 2], deadline=60.0))
    sim.run_until(lambda: h.passes_since.get(2, 0) >= 3, max_time=40.0)
    now = sim.clock()
    assert got.get(1) == payload and h.confirmed == set()  # it has it; the server cannot know
    assert h.passes_since.get(1, 0) == 0 and h.stalled(1, now, 3, 1e9) is None
    assert h.stalled(2, now, 3, 1e9) is not None
    assert h.stalled(1, now, 3, 0.0) is not None  # the time bound still applies to it
