"""Selective-repeat ARQ: ACK codec, delivery over lossy simulated links, failures, pacing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleflu.link.arq import (
    ACK_HEADER,
    AckInfo,
    ArqEndpoint,
    SendStatus,
    ack_from_bitmap,
    decode_ack,
    encode_ack,
)
from scaleflu.link.frame import BROADCAST, FrameType, decode_frame, encode_frame
from scaleflu.link.sim import ChannelModel, SimNetwork
from scaleflu.link.wire import Encoding, decode_tensors, encode_tensors


class FakeClock:
    """Manually advanced clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------------------- ACK codec
@settings(max_examples=300, deadline=None)
@given(bits=st.lists(st.booleans(), min_size=1, max_size=300), max_bytes=st.integers(1, 40))
def test_ack_from_bitmap_is_faithful(bits: list[bool], max_bytes: int) -> None:
    count = len(bits)
    full = bytearray((count + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            full[i >> 3] |= 0x80 >> (i & 7)
    info = ack_from_bitmap(bytes(full), count, max_bytes)
    assert decode_ack(encode_ack(info)) == info
    assert len(info.bitmap) <= max_bytes
    assert all(bits[: info.base])
    assert info.base == count or not bits[info.base]
    assert info.complete == all(bits)
    for i in range(info.base, info.covered()):
        j = i - info.base
        assert bool(info.bitmap[j >> 3] & (0x80 >> (j & 7))) == bits[i]
    if 8 * max_bytes >= count - info.base:  # no truncation: every received fragment reported
        assert not any(bits[info.covered() :])


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        ACK_HEADER.pack(2, 5, 0, 0),  # unknown flag
        ACK_HEADER.pack(0, 5, 0, 1),  # bitmap length mismatch
        ACK_HEADER.pack(0, 0, 0, 0),  # count 0
        ACK_HEADER.pack(0, 5, 6, 0),  # base > count
        ACK_HEADER.pack(1, 5, 4, 0),  # complete with base != count
        ACK_HEADER.pack(0, 5, 0, 1) + b"\xff",  # bits beyond count
    ],
)
def test_malformed_ack_rejected(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_ack(payload)


# ------------------------------------------------------------------------ delivery over loss
def _lenet_bytes(make_lenet, seed: int) -> tuple[dict, bytes]:  # noqa: ANN001
    sd = make_lenet(seed)
    return sd, encode_tensors(sd, encoding=Encoding.RAW)


@pytest.mark.parametrize(("loss", "seed"), [(0.1, 1), (0.1, 2), (0.2, 3), (0.2, 4)])
def test_lenet_state_dict_bit_exact_over_lossy_link(loss: float, seed: int, make_lenet) -> None:  # noqa: ANN001
    model = ChannelModel(
        loss=loss,
        ber=1e-5,
        duplicate=0.03,
        reorder=0.03,
        delay=0.002,
        jitter=0.001,
        rate_bytes_per_s=700e3,
    )
    net = SimNetwork(model, seed=seed)
    a = net.add_endpoint(1, rate_bytes_per_s=650e3)
    b = net.add_endpoint(2, rate_bytes_per_s=650e3)
    sd_a, data_a = _lenet_bytes(make_lenet, seed)
    sd_b, data_b = _lenet_bytes(make_lenet, seed + 100)
    ha = a.send(2, data_a)
    hb = b.send(1, data_b)  # both directions at once: ACKs share the medium with data
    assert net.run_until(lambda: ha.done() and hb.done(), max_time=60)
    net.run_until(lambda: False, max_time=net.now + 2.0)  # let late duplicates arrive
    assert ha.status is SendStatus.DELIVERED and hb.status is SendStatus.DELIVERED
    assert net.inbox[2] == [(1, data_a)] and net.inbox[1] == [(2, data_b)]
    got = decode_tensors(net.inbox[2][0][1])
    assert all(got[k].tobytes() == v.tobytes() for k, v in sd_a.items())
    assert b.stats.crc_errors + a.stats.crc_errors > 0  # bit flips happened and were caught
    assert ha.retransmissions > 0
    assert a.stats.delivered == 1 and b.stats.delivered == 1


def test_many_messages_interleaved_to_one_receiver() -> None:
    net = SimNetwork(ChannelModel(loss=0.15, delay=0.001, rate_bytes_per_s=2e6), seed=7)
    net.add_endpoint(0)
    senders = [net.add_endpoint(n, rate_bytes_per_s=5e5) for n in (1, 2, 3)]
    rng = random.Random(0)
    sent = {}
    handles = []
    for ep in senders:
        for _ in range(3):
            data = rng.randbytes(rng.randrange(0, 20000))
            handles.append(ep.send(0, data))
            sent.setdefault(ep.node_id, []).append(data)
    assert net.run_until(lambda: all(h.done() for h in handles), max_time=60)
    assert all(h.status is SendStatus.DELIVERED for h in handles)
    got: dict[int, list[bytes]] = {}
    for src, data in net.inbox[0]:
        got.setdefault(src, []).append(data)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in sent.items()}


# ---------------------------------------------------------------------------- explicit failure
def test_deadline_expiry_reports_unconfirmed_when_all_was_sent() -> None:
    net = SimNetwork(ChannelModel(loss=1.0), seed=0)
    a = net.add_endpoint(1)
    net.add_endpoint(2)
    h = a.send(2, b"x" * 5000, deadline=3.0)
    assert net.run_until(h.done, max_time=100)
    assert h.status is SendStatus.UNCONFIRMED and h.reason == "deadline"
    assert 3.0 <= h.elapsed < 3.6
    assert a.pending_sends == 0 and a.next_deadline() is None
    assert a.stats.rto_expiries > 0


def test_retransmissions_back_off_exponentially_up_to_max_backoff() -> None:
    clock = FakeClock()
    sent: list[float] = []
    ep = ArqEndpoint(
        1,
        lambda raw: sent.append(clock.t),
        clock=clock,
        initial_rto=0.1,
        max_rto=10,
        deadline=30,
        max_backoff=3,
        rto_copies=2,
    )
    ep.send(2, b"hello")
    while clock.t < 20:
        nd = ep.next_deadline()
        assert nd is not None
        clock.t = nd
        ep.poll()
    times, copies = np.unique(sent, return_counts=True)
    assert copies[0] == 1 and np.all(copies[1:] == 2)  # every timeout sends two copies
    gaps = np.diff(times)
    assert len(times) >= 8
    # doubling per round of timeouts, capped at 2**max_backoff: 0.1, 0.2, 0.4, 0.8, 0.8, ...
    np.testing.assert_allclose(gaps[:7], [0.1, 0.2, 0.4, 0.8, 0.8, 0.8, 0.8], rtol=1e-6)


def test_fresh_ack_resets_the_backoff_and_rtt_follows_rfc6298() -> None:
    clock = FakeClock()
    a_out: list[bytes] = []
    b_out: list[bytes] = []
    a = ArqEndpoint(1, a_out.append, clock=clock, initial_rto=0.1, min_rto=0.01, ack_delay=0.0)
    b = ArqEndpoint(2, b_out.append, clock=clock, ack_every=1, ack_delay=0.0)
    h = a.send(2, bytes(6 * 1474))  # 6 fragments (<= rto_probe); the first window is lost
    a_out.clear()
    for _ in range(2):  # two rounds of timeouts, nothing comes back
        clock.t = a.next_deadline()
        a.poll()
        a_out.clear()
    assert a._peers[2].backoff == 2 and abs(a.rto(2) - 0.4) < 1e-9
    clock.t = a.next_deadline()
    a.poll()  # third round: deliver it, with one RTT of 30 ms
    frames = list(a_out)
    a_out.clear()
    clock.t += 0.03
    for raw in frames:
        b.on_frame(raw)
    for raw in b_out:
        a.on_frame(raw)
    assert h.status is SendStatus.DELIVERED
    p = a._peers[2]
    assert p.backoff == 0  # reset by the fresh ACK
    assert p.srtt is None  # Karn: every fragment was retransmitted, no RTT sample
    h2 = a.send(2, bytes(1474 * 3))
    frames = list(a_out)
    a_out.clear()
    b_out.clear()
    clock.t += 0.05
    for raw in frames:
        b.on_frame(raw)
    for raw in b_out:
        a.on_frame(raw)
    assert h2.status is SendStatus.DELIVERED
    # three ACKs (ack_every 1), three samples R = 50 ms: SRTT = R, RTTVAR = R/2 * (3/4)**2
    assert abs(p.srtt - 0.05) < 1e-9 and abs(p.rttvar - 0.025 * 0.75**2) < 1e-9
    assert abs(a.rto(2) - (0.05 + 4 * 0.025 * 0.75**2)) < 1e-9


def test_max_retransmissions_fails() -> None:
    net = SimNetwork(ChannelModel(loss=1.0), seed=0)
    a = net.add_endpoint(1, max_retransmissions=2, initial_rto=0.1)
    net.add_endpoint(2)
    h = a.send(2, b"abc")
    assert net.run_until(h.done, max_time=100)
    assert h.reason == "max_retransmissions" and h.frames_sent == 3
    assert h.status is SendStatus.UNCONFIRMED  # every fragment left: delivery unknown


def test_deadline_before_every_fragment_left_is_failed() -> None:
    # window 2 and a dead channel: most fragments never leave, so the message cannot be there
    net = SimNetwork(ChannelModel(loss=1.0), seed=0)
    a = net.add_endpoint(1, window=2)
    net.add_endpoint(2)
    h = a.send(2, bytes(20_000), deadline=2.0)
    assert net.run_until(h.done, max_time=100)
    assert h.status is SendStatus.FAILED and h.reason == "deadline"
    assert a.stats.sends_failed == 1 and a.stats.sends_unconfirmed == 0


def test_receiver_refuses_oversized_message() -> None:
    net = SimNetwork(ChannelModel(), seed=0)
    a = net.add_endpoint(1)
    b = net.add_endpoint(2, reassembly_max_bytes=10_000)
    h = a.send(2, bytes(50_000))
    assert net.run_until(h.done, max_time=10)
    assert h.status is SendStatus.FAILED and h.reason == "rejected by receiver: too_large"
    assert b.stats.nacks_tx >= 1 and net.inbox[2] == []


def test_receiver_eviction_resets_sender_and_still_delivers() -> None:
    net = SimNetwork(ChannelModel(delay=0.001, rate_bytes_per_s=1e6), seed=0)
    a = net.add_endpoint(1, rate_bytes_per_s=5e5)
    b = net.add_endpoint(2, reassembly_max_messages=1)
    c = net.add_endpoint(3)
    data = random.Random(1).randbytes(100_000)
    h = a.send(2, data)
    net.run_until(lambda: (b.reassembler.progress(1, h.msg_id) or (0, 0))[0] > 20, max_time=10)
    small = bytes(3000)  # two fragments: a partial message that evicts a's at the receiver
    hc = c.send(2, small)
    assert net.run_until(lambda: h.done() and hc.done(), max_time=60)
    assert h.status is SendStatus.DELIVERED and hc.status is SendStatus.DELIVERED
    assert b.reassembler.stats.evictions >= 1 and a.stats.nacks_rx >= 1
    assert sorted(net.inbox[2]) == sorted([(1, data), (3, small)])


def test_retransmission_after_completion_is_reacked_not_redelivered() -> None:
    clock = FakeClock()
    a_out: list[bytes] = []
    b_out: list[bytes] = []
    a = ArqEndpoint(1, a_out.append, clock=clock, initial_rto=0.2, msg_id_start=5)
    b = ArqEndpoint(2, b_out.append, clock=clock)
    h = a.send(2, bytes(3000))
    for raw in a_out:
        b.on_frame(raw)
    a_out.clear()
    assert b.receive() == (1, bytes(3000))
    assert decode_frame(b_out[-1]).type == FrameType.ACK
    b_out.clear()  # every ACK lost
    clock.t = 0.25
    a.poll()
    assert a_out, "sender must retransmit after the RTO"
    for raw in a_out:
        b.on_frame(raw)
    assert b.receive() is None and b.stats.delivered == 1
    acks = [decode_ack(decode_frame(r).payload) for r in b_out]
    assert acks and acks[0].complete
    a.on_frame(b_out[0])
    assert h.status is SendStatus.DELIVERED


# ----------------------------------------------------------------------------- window, pacing
def test_window_and_rate_are_respected() -> None:
    clock = FakeClock()
    log: list[tuple[float, int]] = []
    rate = 100_000.0
    ep = ArqEndpoint(
        1,
        lambda raw: log.append((clock.t, len(raw))),
        clock=clock,
        window=8,
        rate_bytes_per_s=rate,
        burst_bytes=3000,
        initial_rto=100.0,
    )
    ep.send(2, bytes(60_000))
    assert len(log) <= 8
    while len(log) < 8:
        nd = ep.next_deadline()
        assert nd is not None
        clock.t = nd
        ep.poll()
    assert len(log) == 8  # window full: no ACK came
    clock.t += 1.0
    ep.poll()
    assert len(log) == 8
    times = np.array([t for t, _ in log])
    sizes = np.array([n for _, n in log])
    for i in range(len(log)):
        for j in range(i, len(log)):
            assert sizes[i : j + 1].sum() <= 3000 + rate * (times[j] - times[i]) + 1e-6


def test_pacing_limits_throughput_in_simulation() -> None:
    net = SimNetwork(ChannelModel(delay=0.001), seed=0)
    a = net.add_endpoint(1, rate_bytes_per_s=200_000.0, burst_bytes=3000)
    net.add_endpoint(2)
    h = a.send(2, bytes(200_000))
    assert net.run_until(h.done, max_time=60)
    assert h.status is SendStatus.DELIVERED
    assert h.elapsed >= (200_000 * 1.017 - 3000) / 200_000.0


# ---------------------------------------------------------------------------- robustness
def test_a_busy_node_takes_waiting_frames_in_order_when_its_stall_ends() -> None:
    # SimNetwork's busy_after_message: after each delivered message node 1 processes nothing
    # for 0.5 s; the second message (sent at once behind the first) is delivered after that
    # stall, whole and in order, and a negative stall is refused
    net = SimNetwork(ChannelModel(delay=0.001, rate_bytes_per_s=1e6), seed=0)
    a = net.add_endpoint(0)
    got: list[tuple[float, bytes]] = []
    net.add_endpoint(1, on_message=lambda src, m: got.append((net.now, m)), busy_after_message=0.5)
    h1, h2 = a.send(1, b"x" * 20_000), a.send(1, b"y" * 20_000)
    assert net.run_until(lambda: h1.done() and h2.done())
    assert h1.status is h2.status is SendStatus.DELIVERED
    assert [m for _, m in got] == [b"x" * 20_000, b"y" * 20_000]
    assert got[0][0] + 0.5 <= got[1][0] < got[0][0] + 0.6
    with pytest.raises(ValueError, match="busy_after_message"):
        net.add_endpoint(2, busy_after_message=-1.0)


def test_send_argument_checks() -> None:
    ep = ArqEndpoint(1, lambda raw: None)
    with pytest.raises(ValueError):
        ep.send(BROADCAST, b"x")
    with pytest.raises(ValueError):
        ep.send(1, b"x")
    with pytest.raises(ValueError):
        ArqEndpoint(BROADCAST, lambda raw: None)


def test_frames_for_others_are_ignored_and_broadcast_is_delivered_unacked() -> None:
    out: list[bytes] = []
    ep = ArqEndpoint(2, out.append)
    ep.on_frame(encode_frame(FrameType.DATA, 1, 3, 1, 0, 1, b"not mine"))
    ep.on_frame(encode_frame(FrameType.DATA, 2, 2, 1, 0, 1, b"my own echo"))
    assert ep.stats.not_for_us == 2 and ep.receive() is None
    ep.on_frame(encode_frame(FrameType.DATA, 1, BROADCAST, 9, 0, 1, b"all"))
    assert ep.receive() == (1, b"all") and out == []


def test_the_mac_reserved_msg_id_is_never_a_message() -> None:
    """msg_id 0xFFFFFFFF marks MAC control frames: never sent under, dropped when received."""
    from scaleflu.link.frame import RESERVED_MSG_ID
    from scaleflu.link.mac import MAC_MSG_ID, MacType, encode_mac, mac_on_air

    assert MAC_MSG_ID == RESERVED_MSG_ID == 0xFFFFFFFF
    out: list[bytes] = []
    ep = ArqEndpoint(2, out.append)
    beacon = mac_on_air(encode_mac(MacType.BEACON, 0, BROADCAST, b"\x00" * 8), 0, BROADCAST)
    grant = mac_on_air(encode_mac(MacType.GRANT, 0, 2, b"\x00" * 9), 0, 2)
    for raw in (beacon, grant, encode_frame(FrameType.DATA, 1, 2, RESERVED_MSG_ID, 0, 1, b"x")):
        ep.on_frame(raw)
    ep.poll()
    assert ep.stats.mac_frames_dropped == 3 and ep.receive() is None and out == []
    # the id allocator wraps around it, and it cannot be forced
    sender = ArqEndpoint(1, out.append, msg_id_start=RESERVED_MSG_ID - 1)
    ids = [sender.send(2, b"m").msg_id for _ in range(2)]
    assert ids == [RESERVED_MSG_ID - 1, 0]
    assert ArqEndpoint(1, out.append, msg_id_start=RESERVED_MSG_ID).send(2, b"m").msg_id == 0
    with pytest.raises(ValueError, match="out of range"):
        sender.send(2, b"other", msg_id=RESERVED_MSG_ID)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=10), st.data())
def test_random_frames_never_break_the_endpoint(chunks: list[bytes], data: st.DataObject) -> None:
    clock = FakeClock()
    ep = ArqEndpoint(2, lambda raw: None, clock=clock, msg_id_start=0)
    h = ep.send(1, bytes(5000))
    for c in chunks:
        ep.on_frame(c)
        ftype = data.draw(st.sampled_from(list(FrameType)))
        mid = data.draw(st.sampled_from([0, 1]))
        ep.on_frame(encode_frame(ftype, 1, 2, mid, 0, 1, c))
        clock.t += 0.1
        ep.poll()
    assert h.status in (
        SendStatus.PENDING,
        SendStatus.DELIVERED,
        SendStatus.FAILED,
        SendStatus.UNCONFIRMED,
    )
    if h.status is SendStatus.DELIVERED:  # only a well-formed complete ACK can do this
        assert ep.stats.acks_rx >= 1


def test_ack_info_covered_ignores_padding() -> None:
    assert AckInfo(False, 20, 4, b"\xa0").covered() == 7
    assert AckInfo(False, 20, 4, b"").covered() == 4


@settings(max_examples=40, deadline=None)
@given(
    loss=st.floats(0.0, 0.6),
    ber=st.sampled_from([0.0, 1e-5, 1e-4]),
    duplicate=st.floats(0.0, 0.2),
    reorder=st.floats(0.0, 0.2),
    sizes=st.lists(st.integers(0, 12_000), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_delivered_exactly_once_or_failed_never_corrupted(
    loss: float, ber: float, duplicate: float, reorder: float, sizes: list[int], seed: int
) -> None:
    model = ChannelModel(
        loss=loss,
        ber=ber,
        duplicate=duplicate,
        reorder=reorder,
        delay=0.002,
        rate_bytes_per_s=1e6,
    )
    net = SimNetwork(model, seed=seed)
    a = net.add_endpoint(1, rate_bytes_per_s=9e5, deadline=15.0)
    net.add_endpoint(2)
    rng = random.Random(seed)
    payloads = [rng.randbytes(n) for n in sizes]
    handles = [a.send(2, p) for p in payloads]
    assert net.run_until(lambda: all(h.done() for h in handles), max_time=100)
    net.run_until(lambda: False, max_time=net.now + 5)
    received = [p for src, p in net.inbox[2] if src == 1]
    for h, p in zip(handles, payloads, strict=True):
        copies = received.count(p)
        assert copies <= 1 + payloads.count(p) - 1
        if h.status is SendStatus.DELIVERED:
            assert copies >= 1
    assert all(p in payloads for p in received)  # nothing corrupted ever reaches the app
    assert len(received) <= len(payloads)


# the 40 %-loss LeNet tail test lives in test_tails.py (one parametrised test, two seeds)


def test_a_stall_retransmits_only_the_oldest_few_fragments() -> None:
    # the whole window times out in the same instant (a CPU stall, a deep queue): that is
    # not 32 losses; only rto_probe fragments go again, the others' timers restart
    clock = FakeClock()
    out: list[bytes] = []
    a = ArqEndpoint(1, out.append, clock=clock, initial_rto=0.1, window=32, rto_probe=4)
    a.send(2, bytes(40 * 1474))
    assert len(out) == 32
    out.clear()
    clock.t = 5.0  # the owner did not poll for 5 s
    a.poll()
    seqs = sorted({decode_frame(r).seq for r in out})
    assert seqs == [0, 1, 2, 3] and a.stats.rto_expiries == 4


def test_ack_of_a_retransmitted_fragment_does_not_make_later_frames_look_lost() -> None:
    # fragment 0 is retransmitted spuriously (its first copy arrived, the ACK was slow); the
    # ACK that covers it must not make frames 4..7, still on their way, look lost
    clock = FakeClock()
    a_out: list[bytes] = []
    b_out: list[bytes] = []
    a = ArqEndpoint(1, a_out.append, clock=clock, window=8, rto_probe=1, initial_rto=0.5)
    b = ArqEndpoint(2, b_out.append, clock=clock, ack_every=100)
    a.send(2, bytes(10 * 1474))
    first = list(a_out)
    a_out.clear()
    for raw in first[:4]:
        b.on_frame(raw)
    b_out.clear()  # its delayed ACK has not been sent yet
    clock.t = 0.5
    a.poll()  # the timer: fragment 0 again
    assert [decode_frame(r).seq for r in a_out] == [0]
    b.on_frame(a_out[0])  # a duplicate: b ACKs 0..3 at once
    a_out.clear()
    assert b_out
    clock.t = 0.51
    for raw in b_out:
        a.on_frame(raw)
    assert a.stats.fast_retransmissions == 0
    assert {decode_frame(r).seq for r in a_out} <= {8, 9}  # only new fragments, no copies
