"""Link frames: the fixed 22-byte header + payload + CRC32 shared with the C++ GNU Radio block.

All fields big-endian::

    off size field
    0   2    magic 0x5346 ("SF")
    2   1    version = 1
    3   1    type: 0 DATA, 1 ACK, 2 NACK (others rejected)
    4   2    src node id
    6   2    dst node id (0xFFFF = broadcast)
    8   4    msg_id
    12  4    seq (fragment index, < count)
    16  4    count (fragments in the message, >= 1)
    20  2    length (payload bytes)
    22  len  payload
    22+len 4 crc32 (zlib.crc32 over bytes 0 .. 22+len-1)

This layout is fixed: do not change it without changing the C++ block.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

FRAME_MAGIC = 0x5346
FRAME_VERSION = 1
FRAME_HEADER = struct.Struct(">HBBHHIIIH")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 22
FRAME_CRC_SIZE = 4
FRAME_OVERHEAD = FRAME_HEADER_SIZE + FRAME_CRC_SIZE  # 26
DEFAULT_MTU = 1500
MIN_MTU = FRAME_OVERHEAD + 1
MAX_MTU = FRAME_OVERHEAD + 0xFFFF
BROADCAST = 0xFFFF
# DATA frames with this msg_id carry MAC control frames (scaleflu.link.mac), never message
# fragments: an ArqEndpoint never sends under it and drops such frames when no MAC took them
RESERVED_MSG_ID = 0xFFFFFFFF


class FrameType(enum.IntEnum):
    """Frame types of the link layer."""

    DATA = 0
    ACK = 1
    NACK = 2


class FrameError(ValueError):
    """Base class of every error raised while decoding a frame."""


class FrameCrcError(FrameError):
    """The frame CRC32 does not match its header and payload."""


class FrameMagicError(FrameError):
    """The frame does not start with magic 0x5346."""


class FrameVersionError(FrameError):
    """The frame has an unknown version."""


class FrameTypeError(FrameError):
    """The frame type is reserved."""


class FrameLengthError(FrameError):
    """The length field does not match the number of bytes received (truncated or trailing)."""


class FrameSeqError(FrameError):
    """count == 0 or seq >= count."""


class FrameTooLongError(FrameError):
    """The frame is longer than the MTU."""


@dataclass(frozen=True)
class Frame:
    """A decoded link frame."""

    type: FrameType
    src: int
    dst: int
    msg_id: int
    seq: int
    count: int
    payload: bytes

    def encode(self) -> bytes:
        """Serialise this frame (same as encode_frame)."""
        return encode_frame(
            self.type, self.src, self.dst, self.msg_id, self.seq, self.count, self.payload
        )


def max_payload(mtu: int = DEFAULT_MTU) -> int:
    """Largest payload a frame of at most ``mtu`` bytes can carry (mtu - 26)."""
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise ValueError(f"mtu must be in [{MIN_MTU}, {MAX_MTU}] (as in the C++ block), got {mtu}")
    return mtu - FRAME_OVERHEAD


def encode_frame(
    type: FrameType | int,
    src: int,
    dst: int,
    msg_id: int,
    seq: int,
    count: int,
    payload: bytes = b"",
    mtu: int = DEFAULT_MTU,
) -> bytes:
    """Build one frame; raises ValueError for out-of-range fields or a frame longer than mtu."""
    ftype = FrameType(type)
    for label, value, limit in (
        ("src", src, 0xFFFF),
        ("dst", dst, 0xFFFF),
        ("msg_id", msg_id, 0xFFFFFFFF),
        ("seq", seq, 0xFFFFFFFF),
        ("count", count, 0xFFFFFFFF),
    ):
        if not 0 <= value <= limit:
            raise ValueError(f"{label} {value} out of range 0..{limit}")
    if count < 1 or seq >= count:
        raise ValueError(f"need count >= 1 and seq < count (seq={seq}, count={count})")
    if len(payload) > max_payload(mtu):
        raise ValueError(f"payload of {len(payload)} bytes exceeds {max_payload(mtu)} (mtu {mtu})")
    head = FRAME_HEADER.pack(
        FRAME_MAGIC, FRAME_VERSION, int(ftype), src, dst, msg_id, seq, count, len(payload)
    )
    body = head + bytes(payload)
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def decode_frame(raw: bytes | bytearray | memoryview, mtu: int = DEFAULT_MTU) -> Frame:
    """Parse and validate one frame; raises a FrameError subclass for anything malformed."""
    raw = bytes(raw)
    if len(raw) > mtu:
        raise FrameTooLongError(f"frame of {len(raw)} bytes exceeds mtu {mtu}")
    if len(raw) < FRAME_OVERHEAD:
        if len(raw) >= 2 and struct.unpack_from(">H", raw)[0] != FRAME_MAGIC:
            raise FrameMagicError("bad frame magic")
        raise FrameLengthError(f"frame of {len(raw)} bytes is shorter than header + CRC")
    magic, version, ftype, src, dst, msg_id, seq, count, length = FRAME_HEADER.unpack_from(raw)
    if magic != FRAME_MAGIC:
        raise FrameMagicError(f"bad frame magic 0x{magic:04x}")
    if version != FRAME_VERSION:
        raise FrameVersionError(f"frame version {version}")
    if FRAME_OVERHEAD + length != len(raw):
        raise FrameLengthError(f"length field {length} but {len(raw) - FRAME_OVERHEAD} bytes")
    (crc,) = struct.unpack_from(">I", raw, FRAME_HEADER_SIZE + length)
    if zlib.crc32(raw[: FRAME_HEADER_SIZE + length]) & 0xFFFFFFFF != crc:
        raise FrameCrcError("frame CRC32 mismatch")
    if ftype not in FrameType._value2member_map_:
        raise FrameTypeError(f"reserved frame type {ftype}")
    if count == 0 or seq >= count:
        raise FrameSeqError(f"seq {seq} / count {count}")
    return Frame(
        FrameType(ftype),
        src,
        dst,
        msg_id,
        seq,
        count,
        raw[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + length],
    )
