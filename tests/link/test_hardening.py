"""Link hardening: truthful status, retries delivered once, repeated COMPLETE ACKs, link keys,
unknown NACK codes, per-sender quotas."""

from __future__ import annotations

import random

import pytest

from scaleflu.link.arq import (
    NACK_PAYLOAD,
    TAG_SIZE,
    AckInfo,
    ArqEndpoint,
    SendStatus,
    decode_ack,
    encode_ack,
    encode_tagged_frame,
)
from scaleflu.link.frame import FrameType, decode_frame, encode_frame
from scaleflu.link.sim import ChannelModel, SimNetwork

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


class FakeClock:
    """Manually advanced clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _pair(clock: FakeClock, **kw: object) -> tuple[ArqEndpoint, list[bytes], ArqEndpoint, list]:
    a_out: list[bytes] = []
    b_out: list[bytes] = []
    a = ArqEndpoint(1, a_out.append, clock=clock, msg_id_start=100, **kw)
    b = ArqEndpoint(2, b_out.append, clock=clock, msg_id_start=500, **kw)
    return a, a_out, b, b_out


def _run(clock: FakeClock, eps: list[ArqEndpoint], until: float) -> None:
    while True:
        nds = [d for d in (e.next_deadline() for e in eps) if d is not None]
        if not nds or min(nds) > until:
            clock.t = until
            return
        clock.t = max(clock.t, min(nds))
        for e in eps:
            e.poll()


def _complete_acks(raws: list[bytes]) -> int:
    n = 0
    for r in raws:
        f = decode_frame(r)
        if f.type == FrameType.ACK and decode_ack(f.payload).complete:
            n += 1
    return n


# ------------------------------------------------------------------ truthful status, retries
def test_lost_acks_give_unconfirmed_and_the_retry_is_delivered_once() -> None:
    clock = FakeClock()
    a, a_out, b, b_out = _pair(clock, initial_rto=0.2, deadline=2.0)
    data = random.Random(0).randbytes(10_000)
    h = a.send(2, data)
    for _ in range(100):  # every DATA frame arrives, every ACK is lost
        for raw in a_out:
            b.on_frame(raw)
        a_out.clear()
        b_out.clear()
        if h.done():
            break
        _run(clock, [a, b], clock.t + 0.1)
    assert b.stats.delivered == 1 and b.receive() == (1, data)
    assert h.status is SendStatus.UNCONFIRMED and h.reason == "deadline"
    assert a.stats.sends_unconfirmed == 1 and a.stats.sends_failed == 0
    # the application retries with the same bytes: same message id, recognised, not redelivered
    h2 = a.send(2, data)
    assert h2.retry and h2.msg_id == h.msg_id and a.stats.retries_recognised == 1
    for raw in a_out:
        b.on_frame(raw)
    for raw in b_out:
        a.on_frame(raw)
    assert h2.status is SendStatus.DELIVERED
    assert b.stats.delivered == 1 and b.receive() is None


def test_new_bytes_after_unconfirmed_get_a_new_id_and_forced_ids_are_checked() -> None:
    clock = FakeClock()
    a, a_out, _, _ = _pair(clock, initial_rto=0.1, deadline=0.5)
    h = a.send(2, b"first")
    _run(clock, [a], 1.0)
    assert h.status is SendStatus.UNCONFIRMED
    h2 = a.send(2, b"second")
    assert h2.msg_id != h.msg_id and not h2.retry
    with pytest.raises(ValueError, match="other bytes"):
        a.send(2, b"third", msg_id=h.msg_id)
    h3 = a.send(2, b"first", msg_id=h.msg_id)
    assert h3.retry and h3.msg_id == h.msg_id
    with pytest.raises(ValueError, match="still being sent"):
        a.send(2, b"first", msg_id=h.msg_id)


def test_retry_of_unconfirmed_over_lossy_link_is_delivered_exactly_once() -> None:
    # 70 % loss and a short deadline: some sends end unconfirmed; retried until delivered,
    # every message reaches the application exactly once
    net = SimNetwork(ChannelModel(loss=0.7, delay=0.002, rate_bytes_per_s=1e6), seed=3)
    # deadline 0.2 s: 9 of 15 sends end unconfirmed (with 0.5 s the ARQ's tail repairs leave
    # none: the premise is that some do)
    a = net.add_endpoint(1, deadline=0.2, initial_rto=0.05)
    net.add_endpoint(2)
    rng = random.Random(3)
    msgs = [rng.randbytes(rng.randrange(1, 6000)) for _ in range(6)]
    statuses = []
    for m in msgs:
        for _ in range(40):
            h = a.send(2, m)
            assert net.run_until(h.done, max_time=net.now + 10)
            statuses.append(h.status)
            if h.status is SendStatus.DELIVERED:
                break
        assert h.status is SendStatus.DELIVERED
    net.run_until(lambda: False, max_time=net.now + 3)
    assert SendStatus.UNCONFIRMED in statuses and SendStatus.FAILED not in statuses
    got = [p for src, p in net.inbox[2] if src == 1]
    assert sorted(got) == sorted(msgs)


# ------------------------------------------------------------------ completion ACK repeated
def test_complete_ack_is_repeated_without_retransmissions() -> None:
    clock = FakeClock()
    a, a_out, b, b_out = _pair(clock, complete_ack_repeats=3, complete_ack_interval=0.05)
    h = a.send(2, bytes(4000))
    for raw in a_out:
        b.on_frame(raw)
    a_out.clear()
    assert b.stats.delivered == 1 and _complete_acks(b_out) == 1
    b_out.clear()
    _run(clock, [b], 1.0)  # no frame from the sender in between
    assert _complete_acks(b_out) == 3 and b.stats.complete_acks_repeated == 3
    assert b.idle
    a.on_frame(b_out[-1])  # only the last repeat reaches the sender
    assert h.status is SendStatus.DELIVERED


# ------------------------------------------------------------------ link keys (forgery)
def _keyed_pair(clock: FakeClock) -> tuple[ArqEndpoint, list[bytes], ArqEndpoint, list]:
    a, a_out, b, b_out = _pair(clock, initial_rto=0.2)
    a.set_peer_key(2, KEY)
    b.set_peer_key(1, KEY)
    return a, a_out, b, b_out


def test_forged_complete_ack_does_not_mark_a_send_delivered() -> None:
    clock = FakeClock()
    a, a_out, _, _ = _keyed_pair(clock)
    h = a.send(2, bytes(5000))
    count = decode_frame(a_out[0]).count
    ack = encode_ack(AckInfo(True, count, count, b""))
    a.on_frame(encode_frame(FrameType.ACK, 2, 1, h.msg_id, 0, 1, ack))  # no tag
    a.on_frame(encode_frame(FrameType.ACK, 2, 1, h.msg_id, 0, 1, ack + bytes(TAG_SIZE)))
    a.on_frame(encode_tagged_frame(OTHER_KEY, FrameType.ACK, 2, 1, h.msg_id, 0, 1, ack))
    assert h.status is SendStatus.PENDING and a.stats.auth_failures == 3
    assert a.stats.acks_rx == 0
    a.on_frame(encode_tagged_frame(KEY, FrameType.ACK, 2, 1, h.msg_id, 0, 1, ack))
    assert h.status is SendStatus.DELIVERED


def test_forged_nack_neither_fails_nor_resets_a_send() -> None:
    clock = FakeClock()
    a, a_out, _, _ = _keyed_pair(clock)
    h = a.send(2, bytes(5000))
    count = decode_frame(a_out[0]).count
    for code in (1, 2, 3):
        a.on_frame(
            encode_frame(FrameType.NACK, 2, 1, h.msg_id, 0, 1, NACK_PAYLOAD.pack(code, count))
        )
    assert h.status is SendStatus.PENDING and a.stats.auth_failures == 3
    assert a.stats.nacks_rx == 0


def test_unknown_nack_code_is_rejected() -> None:
    clock = FakeClock()
    a, a_out, _, _ = _pair(clock)
    h = a.send(2, bytes(5000))
    count = decode_frame(a_out[0]).count
    for payload in (NACK_PAYLOAD.pack(9, count), NACK_PAYLOAD.pack(0, count), b"\x01"):
        a.on_frame(encode_frame(FrameType.NACK, 2, 1, h.msg_id, 0, 1, payload))
    a.on_frame(encode_frame(FrameType.NACK, 2, 1, h.msg_id, 0, 1, NACK_PAYLOAD.pack(2, count + 1)))
    assert h.status is SendStatus.PENDING and a.stats.bad_nacks == 4 and a.stats.nacks_rx == 0
    a.on_frame(encode_frame(FrameType.NACK, 2, 1, h.msg_id, 0, 1, NACK_PAYLOAD.pack(2, count)))
    assert h.status is SendStatus.FAILED and h.reason == "rejected by receiver: refused"


def test_forged_data_is_not_reassembled_into_a_keyed_peers_message() -> None:
    clock = FakeClock()
    _, _, b, _ = _keyed_pair(clock)
    b.on_frame(encode_frame(FrameType.DATA, 1, 2, 77, 0, 1, b"evil"))
    b.on_frame(encode_frame(FrameType.DATA, 1, 2, 78, 0, 3, bytes(100)))
    assert b.receive() is None and b.stats.auth_failures == 2
    assert b.reassembler.messages_in_flight == 0


def test_keyed_link_delivers_bit_exact_over_loss(make_lenet) -> None:  # noqa: ANN001
    from scaleflu.link.wire import Encoding, encode_tensors

    net = SimNetwork(ChannelModel(loss=0.2, ber=1e-5, delay=0.002, rate_bytes_per_s=7e5), seed=5)
    a = net.add_endpoint(1, rate_bytes_per_s=6.5e5)
    b = net.add_endpoint(2)
    a.set_peer_key(2, KEY)
    b.set_peer_key(1, KEY)
    data = encode_tensors(make_lenet(1), encoding=Encoding.RAW)
    h = a.send(2, data)
    assert net.run_until(h.done, max_time=60)
    assert h.status is SendStatus.DELIVERED and net.inbox[2] == [(1, data)]
    assert b.stats.auth_failures == 0 and a.stats.auth_failures == 0
    assert h.count == -(-len(data) // (1474 - TAG_SIZE))


def test_require_auth_drops_frames_from_peers_without_key() -> None:
    clock = FakeClock()
    out: list[bytes] = []
    b = ArqEndpoint(2, out.append, clock=clock, require_auth=True)
    b.on_frame(encode_frame(FrameType.DATA, 5, 2, 1, 0, 1, b"hi"))
    assert b.receive() is None and b.stats.unauthenticated == 1 and out == []


def test_link_key_argument_checks() -> None:
    ep = ArqEndpoint(1, lambda raw: None)
    with pytest.raises(ValueError):
        ep.set_peer_key(2, b"short")
    with pytest.raises(ValueError):
        ep.set_peer_key(1, KEY)
    ep.set_peer_key(2, KEY)
    assert ep.has_peer_key(2)
    ep.set_peer_key(2, None)
    assert not ep.has_peer_key(2)


# ------------------------------------------------------------------ quotas
def _partial_frames(src: int, msg_id: int, count: int, n: int, key: bytes | None) -> list[bytes]:
    out = []
    for seq in range(n):
        body = bytes([seq & 0xFF]) * 1000
        if key is None:
            out.append(encode_frame(FrameType.DATA, src, 2, msg_id, seq, count, body))
        else:
            out.append(encode_tagged_frame(key, FrameType.DATA, src, 2, msg_id, seq, count, body))
    return out


def test_unauthenticated_flood_cannot_evict_a_keyed_peers_partial_message() -> None:
    clock = FakeClock()
    out: list[bytes] = []
    b = ArqEndpoint(
        2, out.append, clock=clock, reassembly_max_messages=4, reassembly_max_bytes=200_000
    )
    b.set_peer_key(1, KEY)
    for raw in _partial_frames(1, 42, 50, 10, KEY):  # 50 kB message, 10 fragments so far
        b.on_frame(raw)
    assert b.reassembler.progress(1, 42) == (10, 50)
    rng = random.Random(0)
    for i in range(2000):  # a flood of partial messages from many claimed senders, no key
        src = rng.choice([1, 3, 4, 5, 6, 7])
        for raw in _partial_frames(src, 1000 + i, 60, 2, None):
            b.on_frame(raw)
        clock.t += 0.001
    assert b.reassembler.progress(1, 42) == (10, 50)  # untouched
    assert b.reassembler.messages_in_flight <= 4
    assert b.reassembler.bytes_in_flight <= 200_000
    assert b.stats.auth_failures > 0  # those claiming to be node 1 were dropped outright
    for raw in _partial_frames(1, 42, 50, 50, KEY)[10:]:
        b.on_frame(raw)
    assert b.receive() is not None


def test_per_sender_quota_holds_against_one_flooding_sender() -> None:
    clock = FakeClock()
    b = ArqEndpoint(
        2,
        lambda raw: None,
        clock=clock,
        reassembly_max_messages=16,
        reassembly_max_messages_per_sender=2,
        reassembly_max_bytes=1_000_000,
        reassembly_max_bytes_per_sender=100_000,
    )
    for raw in _partial_frames(3, 5, 20, 4, None):  # an honest sender without a key
        b.on_frame(raw)
    for i in range(500):
        for raw in _partial_frames(7, 100 + i, 30, 2, None):
            b.on_frame(raw)
        assert b.reassembler.sender_usage(7)[0] <= 2
        assert b.reassembler.sender_usage(7)[1] <= 100_000
    assert b.reassembler.progress(3, 5) == (4, 20)  # the flood only evicted its own messages
