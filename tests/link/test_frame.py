"""Frame codec (fixed layout shared with the C++ block) and fragmentation."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleflu.link.fragment import fragment, fragment_count
from scaleflu.link.frame import (
    FRAME_OVERHEAD,
    Frame,
    FrameCrcError,
    FrameError,
    FrameLengthError,
    FrameMagicError,
    FrameSeqError,
    FrameTooLongError,
    FrameType,
    FrameTypeError,
    FrameVersionError,
    decode_frame,
    encode_frame,
    max_payload,
)


def _raw(
    magic: int = 0x5346,
    version: int = 1,
    ftype: int = 0,
    seq: int = 0,
    count: int = 1,
    payload: bytes = b"abc",
    length: int | None = None,
) -> bytes:
    n = len(payload) if length is None else length
    body = struct.pack(">HBBHHIIIH", magic, version, ftype, 1, 2, 3, seq, count, n) + payload
    return body + struct.pack(">I", zlib.crc32(body))


def test_known_bytes() -> None:
    raw = encode_frame(FrameType.DATA, 0x0102, 0xFFFF, 0x0A0B0C0D, 1, 2, b"\x55")
    assert raw[:22].hex() == "534601000102ffff0a0b0c0d00000001000000020001"
    assert raw[22:23] == b"\x55"
    assert raw[23:] == struct.pack(">I", zlib.crc32(raw[:23]))
    assert len(raw) == FRAME_OVERHEAD + 1
    assert max_payload(1500) == 1474


@settings(max_examples=300, deadline=None)
@given(
    ftype=st.sampled_from(list(FrameType)),
    src=st.integers(0, 0xFFFF),
    dst=st.integers(0, 0xFFFF),
    msg_id=st.integers(0, 2**32 - 1),
    count=st.integers(1, 2**32 - 1),
    data=st.data(),
    mtu=st.integers(27, 1500),
)
def test_frame_round_trip(ftype, src, dst, msg_id, count, data, mtu) -> None:  # noqa: ANN001
    seq = data.draw(st.integers(0, count - 1))
    payload = data.draw(st.binary(max_size=max_payload(mtu)))
    raw = encode_frame(ftype, src, dst, msg_id, seq, count, payload, mtu)
    assert len(raw) <= mtu
    f = decode_frame(raw, mtu)
    assert f == Frame(ftype, src, dst, msg_id, seq, count, payload)
    assert f.encode() == raw


@pytest.mark.parametrize(
    ("raw", "exc"),
    [
        (_raw(magic=0x1234), FrameMagicError),
        (b"\x12\x34\x01", FrameMagicError),
        (_raw(version=2), FrameVersionError),
        (_raw(ftype=3), FrameTypeError),
        (_raw(ftype=255), FrameTypeError),
        (_raw(seq=1, count=1), FrameSeqError),
        (_raw(count=0), FrameSeqError),
        (_raw(length=4), FrameLengthError),
        (_raw(length=2), FrameLengthError),
        (_raw()[:-1], FrameLengthError),
        (_raw() + b"\x00", FrameLengthError),
        (b"SF", FrameLengthError),
        (b"", FrameLengthError),
        (_raw(payload=b"x" * 1475), FrameTooLongError),
    ],
)
def test_decode_errors(raw: bytes, exc: type[FrameError]) -> None:
    with pytest.raises(exc):
        decode_frame(raw)


def test_crc_error_on_any_bit_flip() -> None:
    raw = _raw(payload=b"hello")
    for bit in range(8 * len(raw)):
        b = bytearray(raw)
        b[bit // 8] ^= 0x80 >> (bit % 8)
        with pytest.raises(FrameError):
            decode_frame(bytes(b))
    b = bytearray(raw)
    b[24] ^= 1
    with pytest.raises(FrameCrcError):
        decode_frame(bytes(b))


def test_encode_rejects_bad_fields() -> None:
    with pytest.raises(ValueError):
        encode_frame(FrameType.DATA, 0, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        encode_frame(FrameType.DATA, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        encode_frame(FrameType.DATA, 0x10000, 0, 0, 0, 1)
    with pytest.raises(ValueError):
        encode_frame(7, 0, 0, 0, 0, 1)
    with pytest.raises(ValueError):
        encode_frame(FrameType.DATA, 0, 0, 0, 0, 1, b"x" * 75, mtu=100)
    with pytest.raises(ValueError):
        max_payload(26)
    with pytest.raises(ValueError):
        max_payload(65562)
    assert max_payload(65561) == 65535


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_frame_errors(data: bytes) -> None:
    for raw in (data, b"SF\x01" + data):
        try:
            decode_frame(raw)
        except FrameError:
            pass


@settings(max_examples=100, deadline=None)
@given(message=st.binary(max_size=5000), mtu=st.integers(27, 1600))
def test_fragment_sizes_and_order(message: bytes, mtu: int) -> None:
    frames = fragment(message, 77, 1, 2, mtu)
    assert len(frames) == fragment_count(len(message), mtu)
    decoded = [decode_frame(f, mtu) for f in frames]
    assert all(len(f) <= mtu for f in frames)
    assert [d.seq for d in decoded] == list(range(len(frames)))
    assert {d.count for d in decoded} == {len(frames)}
    assert b"".join(d.payload for d in decoded) == message
    assert all(len(d.payload) == max_payload(mtu) for d in decoded[:-1])


def test_empty_message_is_one_frame() -> None:
    frames = fragment(b"", 1, 1, 2)
    assert len(frames) == 1 and decode_frame(frames[0]).payload == b""
