"""The ARQ's own frames: ACK and NACK payloads, and the link tags of keyed peers.

**Link keys** (optional, per peer): ``set_peer_key(peer, key)`` makes every frame exchanged with
``peer`` carry a 16-byte tag, HMAC-SHA256(key, frame header ‖ payload before the tag) truncated
to 16 bytes, appended to the payload (the frame's length field and CRC cover it). A DATA, ACK or
NACK frame that claims to come from a keyed peer without a valid tag is dropped and counted
(``auth_failures``): nobody without the key can mark a send delivered, fail it, reset it or
inject fragments into it. Both ends must hold the same key (set it on both before sending).
Frames from keyed peers are *trusted* in reassembly: untrusted senders cannot evict them.
``require_auth=True`` drops every frame from a peer without a key, broadcasts included
(``unauthenticated``). Broadcast DATA frames are never tagged (no pairwise key): they are taken
only from keyed peers' ids and held within the untrusted reassembly budget; authenticate them
above the link.
The tag binds the frame to (type, src, dst, msg_id, seq, count); a recorded frame replays only
into the same message under the same key, so derive a fresh key per session.

ACK payload (frame type ACK, src = receiver, dst = sender, msg_id of the message, seq 0, count 1),
big-endian (followed by the 16-byte tag when the peers share a key)::

    off size field
    0   1    flags: bit0 COMPLETE (every fragment received), bit1 SNR (the field below is
             present); other bits 0
    1   4    count: fragment count of the acknowledged message (echo)
    5   4    base: every fragment with seq < base has been received
    9   2    n: bitmap length in bytes
    11  n    bitmap, MSB-first: bit i set = fragment base + i received; bits >= count are 0
    11+n 2   (with SNR) i16: the SNR the receiver measured on the sender's latest DATA frame,
             in 1/4 dB, within -50 .. +100 dB

Version 2 of the ACK added the SNR flag and field (version 1 had no bit1): a receiver whose PHY
measures each frame's SNR (the coded OFDM receiver) reports it, and the sender's link
adaptation chooses its MCS from it (docs/link.md section 3). An ACK without the flag is a
version 1 ACK, byte for byte; a version 1 decoder refuses the flag (unknown flags).

NACK payload: u8 reason, u32 count (echo; a NACK whose count differs is ignored). Reasons: 1
TOO_LARGE and 2 REFUSED (the receiver will never take the message: the send fails), 3 RESET (the
receiver dropped its partial copy after eviction or timeout: the sender forgets all
acknowledgements and sends every fragment again). Any other reason code is rejected and counted
(``bad_nacks``). ACKs are cumulative: a fragment once acknowledged is not sent again unless a
RESET comes.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import zlib
from dataclasses import dataclass

from ..frame import (
    DEFAULT_MTU,
    FRAME_HEADER,
    FRAME_MAGIC,
    FRAME_VERSION,
    FrameType,
    max_payload,
)

ACK_HEADER = struct.Struct(">BIIH")


ACK_HEADER_SIZE = ACK_HEADER.size  # 11


ACK_COMPLETE = 0x01


ACK_SNR = 0x02  # version 2: the payload ends with the receiver's SNR (i16, 1/4 dB)


ACK_VERSION = 2


_SNR_FIELD = struct.Struct(">h")


ACK_SNR_RANGE_DB = (-50.0, 100.0)


NACK_PAYLOAD = struct.Struct(">BI")


NACK_TOO_LARGE = 1


NACK_REFUSED = 2


NACK_RESET = 3


_NACK_REASONS = {NACK_TOO_LARGE: "too_large", NACK_REFUSED: "refused", NACK_RESET: "reset"}


TAG_SIZE = 16  # bytes of the truncated HMAC-SHA256 tag of frames exchanged with a keyed peer


MIN_KEY_SIZE = 16


_CRC = struct.Struct(">I")


def frame_tag(key: bytes, header_and_payload: bytes | memoryview) -> bytes:
    """The 16-byte link tag: HMAC-SHA256(key, frame header ‖ payload before the tag)[:16]."""
    return hmac.digest(key, header_and_payload, hashlib.sha256)[:TAG_SIZE]


def encode_tagged_frame(
    key: bytes,
    type: FrameType | int,
    src: int,
    dst: int,
    msg_id: int,
    seq: int,
    count: int,
    payload: bytes | memoryview,
    mtu: int = DEFAULT_MTU,
) -> bytes:
    """A frame whose payload is ``payload`` followed by its link tag (see the module docstring)."""
    if len(payload) + TAG_SIZE > max_payload(mtu):
        raise ValueError(f"payload of {len(payload)} bytes + tag exceeds {max_payload(mtu)}")
    ftype = FrameType(type)
    for label, value, limit in (
        ("src", src, 0xFFFF),
        ("dst", dst, 0xFFFF),
        ("msg_id", msg_id, 0xFFFFFFFF),
        ("count", count, 0xFFFFFFFF),
    ):
        if not 0 <= value <= limit:
            raise ValueError(f"{label} {value} out of range 0..{limit}")
    if not 0 <= seq < count:
        raise ValueError(f"need count >= 1 and 0 <= seq < count (seq={seq}, count={count})")
    body = (
        FRAME_HEADER.pack(
            FRAME_MAGIC,
            FRAME_VERSION,
            int(ftype),
            src,
            dst,
            msg_id,
            seq,
            count,
            len(payload) + TAG_SIZE,
        )
        + payload
    )
    body += frame_tag(key, body)
    return body + _CRC.pack(zlib.crc32(body) & 0xFFFFFFFF)


@dataclass
class AckInfo:
    """Decoded ACK payload (``snr_db``: the receiver's SNR of our frames, or None)."""

    complete: bool
    count: int
    base: int
    bitmap: bytes
    snr_db: float | None = None

    def covered(self) -> int:
        """One past the highest fragment reported received (padding bits say nothing)."""
        stripped = self.bitmap.rstrip(b"\x00")
        if not stripped:
            return self.base
        last = stripped[-1]
        tail = (last & -last).bit_length() - 1  # trailing zero bits of the last non-zero byte
        return min(self.count, self.base + 8 * len(stripped) - tail)


def _snr_q(snr_db: float) -> int:
    lo, hi = ACK_SNR_RANGE_DB
    if not math.isfinite(snr_db):
        raise ValueError("ACK SNR must be finite")
    return int(round(min(max(float(snr_db), lo), hi) * 4))


def encode_ack(info: AckInfo) -> bytes:
    """Serialise an ACK payload (see the module docstring); the SNR is clamped to its range."""
    flags = ACK_COMPLETE if info.complete else 0
    tail = b""
    if info.snr_db is not None:
        flags |= ACK_SNR
        tail = _SNR_FIELD.pack(_snr_q(info.snr_db))
    head = ACK_HEADER.pack(flags, info.count, info.base, len(info.bitmap))
    return head + bytes(info.bitmap) + tail


def decode_ack(payload: bytes) -> AckInfo:
    """Parse and validate an ACK payload; raise ValueError when malformed."""
    if len(payload) < ACK_HEADER_SIZE:
        raise ValueError("ACK payload too short")
    flags, count, base, n = ACK_HEADER.unpack_from(payload)
    if flags & ~(ACK_COMPLETE | ACK_SNR):
        raise ValueError(f"unknown ACK flags 0x{flags:02x}")
    extra = _SNR_FIELD.size if flags & ACK_SNR else 0
    if len(payload) != ACK_HEADER_SIZE + n + extra:
        raise ValueError("ACK bitmap length mismatch")
    if count < 1 or base > count:
        raise ValueError(f"ACK base {base} / count {count}")
    snr_db = None
    if extra:
        (q,) = _SNR_FIELD.unpack_from(payload, ACK_HEADER_SIZE + n)
        snr_db = q / 4.0
        lo, hi = ACK_SNR_RANGE_DB
        if not lo <= snr_db <= hi:
            raise ValueError(f"ACK SNR {snr_db} dB outside {lo:g} .. {hi:g}")
    bitmap = bytes(payload[ACK_HEADER_SIZE : ACK_HEADER_SIZE + n])
    complete = bool(flags & ACK_COMPLETE)
    if complete and (base != count or n):
        raise ValueError("complete ACK must have base == count and no bitmap")
    if n and base + 8 * n > count:
        beyond = base + 8 * n - count  # trailing bits beyond the message must be zero
        if int.from_bytes(bitmap, "big") & ((1 << beyond) - 1):
            raise ValueError("ACK bitmap has bits beyond count")
    return AckInfo(complete, count, base, bitmap, snr_db)


def ack_from_bitmap(bitmap: bytes, count: int, max_bytes: int) -> AckInfo:
    """Compress a full MSB-first reception bitmap into base + at most max_bytes of bitmap."""
    nbits = len(bitmap) * 8
    lead = len(bitmap) - len(bitmap.lstrip(b"\xff"))
    base = lead * 8
    if lead < len(bitmap):
        b = bitmap[lead]
        while b & (0x80 >> (base - lead * 8)):
            base += 1
    base = min(base, count)
    if base >= count:
        return AckInfo(True, count, count, b"")
    stripped = bitmap.rstrip(b"\x00")
    if not stripped:
        return AckInfo(False, count, base, b"")
    last = stripped[-1]
    high = len(stripped) * 8 - 1
    while not last & (0x80 >> (high & 7)):
        high -= 1
    if high < base:
        return AckInfo(False, count, base, b"")
    width = min(high - base + 1, 8 * max_bytes)
    value = int.from_bytes(bitmap, "big") >> (nbits - base - width)
    value &= (1 << width) - 1
    nbytes = (width + 7) // 8
    value <<= nbytes * 8 - width
    return AckInfo(False, count, base, value.to_bytes(nbytes, "big"))


def _complete_ack(count: int, snr_db: float | None = None) -> bytes:
    return encode_ack(AckInfo(True, count, count, b"", snr_db))
