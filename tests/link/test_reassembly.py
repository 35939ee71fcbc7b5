"""Reassembly under loss, duplicates, reordering, interleaving; memory bounds; fuzzing."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scaleflu.link.fragment import Reassembler, bitmap_get, fragment
from scaleflu.link.frame import FrameType, decode_frame, encode_frame


class FakeClock:
    """Manually advanced clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _frames(message: bytes, msg_id: int, src: int, mtu: int = 100) -> list:
    return [decode_frame(f, mtu) for f in fragment(message, msg_id, src, 0, mtu)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 2000), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_interleaved_lossy_duplicated_reordered(sizes: list[int], seed: int) -> None:
    rng = random.Random(seed)
    msgs = {}
    for i, n in enumerate(sizes):
        key = (rng.randrange(4), 1000 + i)
        msgs[key] = rng.randbytes(n)
    ra = Reassembler(mtu=100, max_messages=len(msgs))
    frames = [f for (src, mid), m in msgs.items() for f in _frames(m, mid, src)]
    done = {}
    lost = []
    order = frames + [rng.choice(frames) for _ in range(len(frames) // 3)]  # duplicates
    rng.shuffle(order)
    for f in order:
        if rng.random() < 0.2:
            lost.append(f)  # lost now, retransmitted later
            continue
        out = ra.push(f)
        if out is not None:
            assert (out.src, out.msg_id) not in done
            done[(out.src, out.msg_id)] = out.payload
    for key in msgs:
        bm = ra.bitmap(*key)
        if bm is not None:
            held = {f.seq for f in frames if (f.src, f.msg_id) == key} - {
                f.seq for f in lost if (f.src, f.msg_id) == key
            }
            for seq in held:
                assert bitmap_get(bm, seq)
    for f in lost:
        out = ra.push(f)
        if out is not None:
            done[(out.src, out.msg_id)] = out.payload
    assert done == msgs
    assert ra.messages_in_flight == 0 and ra.bytes_in_flight == 0
    assert ra.stats.completed == len(msgs)
    assert ra.stats.evictions == 0


def test_bitmap_and_progress() -> None:
    ra = Reassembler(mtu=100)
    fr = _frames(bytes(1000), 5, 1)  # 14 fragments of 74 bytes
    for seq in (0, 2, 9):
        ra.push(fr[seq])
    bm = ra.bitmap(1, 5)
    assert bm == bytes([0b10100000, 0b01000000])
    assert ra.progress(1, 5) == (3, len(fr))
    assert ra.bitmap(1, 6) is None


def test_duplicates_after_completion_are_not_redelivered() -> None:
    ra = Reassembler(mtu=100)
    fr = _frames(b"abc" * 50, 9, 3)
    outs = [ra.push(f) for f in fr]
    assert sum(o is not None for o in outs) == 1
    assert ra.is_completed(3, 9)
    assert all(ra.push(f) is None for f in fr)
    assert ra.stats.duplicates == len(fr)


def test_message_limit_evicts_oldest() -> None:
    ra = Reassembler(mtu=100, max_messages=3)
    for mid in range(5):
        ra.push(_frames(bytes(500), mid, 1)[0])
    assert ra.messages_in_flight == 3
    assert ra.stats.evictions == 2
    assert ra.bitmap(1, 0) is None and ra.bitmap(1, 4) is not None


def test_byte_limit_evicts_and_rejects() -> None:
    dropped = []
    ra = Reassembler(mtu=100, max_bytes=600, on_drop=lambda k, r, c: dropped.append((k, r)))
    for mid in range(3):
        for f in _frames(bytes(500), mid, 1)[:3]:  # 222 bytes + bitmap each
            ra.push(f)
    assert ra.bytes_in_flight <= 600
    assert ra.stats.evictions >= 1
    ra.push(_frames(bytes(5000), 99, 2)[0])  # can never fit
    assert ra.stats.rejected == 1
    assert ((2, 99), "too_large") in dropped
    assert ra.bitmap(2, 99) is None


def test_max_fragments_rejects() -> None:
    ra = Reassembler(max_fragments=10)
    raw = encode_frame(FrameType.DATA, 1, 0, 1, 0, 11, b"x")
    assert ra.push(decode_frame(raw)) is None
    assert ra.stats.rejected == 1 and ra.messages_in_flight == 0


def test_timeout_with_injected_clock() -> None:
    clock = FakeClock()
    ra = Reassembler(mtu=100, timeout=5.0, completed_ttl=10.0, clock=clock)
    fr = _frames(bytes(300), 1, 1)
    ra.push(fr[0])
    clock.t = 4.0
    ra.push(fr[1])  # progress refreshes the timer
    assert ra.next_deadline() == 9.0
    clock.t = 8.9
    assert ra.expire() == []
    clock.t = 9.0
    assert ra.expire() == [(1, 1)]
    assert ra.stats.timeouts == 1 and ra.messages_in_flight == 0
    for f in fr:
        ra.push(f)
    assert ra.is_completed(1, 1)
    clock.t = 19.5
    ra.expire()
    assert not ra.is_completed(1, 1)


def test_inconsistent_count_and_non_data() -> None:
    ra = Reassembler()
    ra.push(decode_frame(encode_frame(FrameType.DATA, 1, 0, 1, 0, 3, b"a")))
    ra.push(decode_frame(encode_frame(FrameType.DATA, 1, 0, 1, 1, 4, b"b")))
    ra.push(decode_frame(encode_frame(FrameType.ACK, 1, 0, 1, 0, 1, b"")))
    assert ra.stats.inconsistent == 1 and ra.stats.not_data == 1


def test_completed_memory_is_bounded() -> None:
    ra = Reassembler(completed_memory=4)
    for mid in range(10):
        ra.push(decode_frame(encode_frame(FrameType.DATA, 1, 0, mid, 0, 1, b"x")))
    assert sum(ra.is_completed(1, m) for m in range(10)) == 4


def test_push_raw_counts_errors() -> None:
    ra = Reassembler()
    good = encode_frame(FrameType.DATA, 1, 0, 1, 0, 1, b"hi")
    bad = bytearray(good)
    bad[-6] ^= 1
    assert ra.push_raw(bytes(bad)) is None
    assert ra.push_raw(b"junk") is None
    assert ra.push_raw(good).payload == b"hi"
    assert (ra.stats.crc_errors, ra.stats.bad_frames, ra.stats.completed) == (1, 1, 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=20))
def test_random_bytes_never_break_reassembler(chunks: list[bytes]) -> None:
    ra = Reassembler(max_messages=4, max_bytes=4096)
    for c in chunks:
        ra.push_raw(c)
        ra.push_raw(b"SF\x01\x00" + c)
    assert ra.messages_in_flight <= 4 and ra.bytes_in_flight <= 4096


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 5),
            st.integers(1, 40),
            st.integers(0, 39),
            st.binary(max_size=60),
        ),
        max_size=200,
    )
)
def test_adversarial_valid_frames_respect_bounds(items: list) -> None:
    clock = FakeClock()
    ra = Reassembler(max_messages=3, max_bytes=2000, timeout=1.0, clock=clock)
    for i, (src, mid, count, seq, payload) in enumerate(items):
        clock.t = i * 0.1
        raw = encode_frame(FrameType.DATA, src, 0, mid, seq % count, count, payload)
        ra.push_raw(raw)
        assert ra.messages_in_flight <= 3
        assert ra.bytes_in_flight <= 2000
