"""The MAC's control frames (BEACON, GRANT, REPORT, JOIN): encoding, parsing, carriage on air.

MAC control frame (big-endian). On air it is the payload of a one-fragment link DATA frame with
msg_id 0xFFFFFFFF (``mac_on_air``), so every PHY chain that carries link frames carries it too
(the C++ frame_parser included); other link frames pass through to the ARQ untouched::

    off size field
    0   2    magic 0x534D ("SM")
    2   1    version = 2
    3   1    type: 1 BEACON, 2 GRANT, 3 REPORT, 4 JOIN
    4   2    src node id
    6   2    dst node id (0xFFFF = all)
    8   2    n: body length
    10  n    body
    10+n 4   crc32 over bytes 0 .. 10+n-1

    BEACON  u16 slots, u32 slot_us, u16 k, k x u16 admitted ids
    GRANT   u32 grant seq, u32 budget bytes, u8 mcs, u16 heard, u8 k, k x (u32 msg_id,
            u32 count) broadcasts to report
    REPORT  u32 grant seq, u32 backlog bytes, u16 sent, i16 snr, u8 k, k x (u32 msg_id,
            u32 count, u8 complete, u16 m, m bytes: bitmap of fragments received, MSB first)
    JOIN    u32 nonce

Version 2 (link adaptation) added GRANT's ``mcs``: the MCS index (``scaleflu.link.mcs``, table
version checked at registration) at which the robot sends its DATA in this grant, 0xFF when the
PHY has one rate (no MCS), and ``heard``: how many of the link frames of the robot's previous
grant the server received (0xFFFF: unknown, its REPORT did not arrive), so a robot whose whole
burst was lost retransmits it at once; and REPORT's ``sent``: link frames the robot put on air
in this grant before the REPORT (the server counts those it received: the burst's losses), and
``snr``:
the SNR the robot's receiver measured on the server's latest frame, in 1/4 dB (-50 .. +100 dB),
-32768 when it has none. Version 1 frames are refused (bad version).
"""

from __future__ import annotations

import enum
import math
import struct
import zlib
from dataclasses import dataclass

from ..frame import (
    FRAME_MAGIC,
    RESERVED_MSG_ID,
    FrameError,
    FrameType,
    decode_frame,
    encode_frame,
)
from ..mcs import MCS_TABLE, MCS_TABLE_VERSION

MAC_MAGIC = 0x534D


MAC_MSG_ID = RESERVED_MSG_ID  # link DATA frames with this msg_id carry MAC control frames


MAC_VERSION = 2


NO_MCS = 0xFF  # GRANT: the PHY has one rate


HEARD_UNKNOWN = 0xFFFF  # GRANT: the server did not get the REPORT of the previous grant


NO_SNR = -32768  # REPORT: no SNR measured


SNR_RANGE_DB = (-50.0, 100.0)


MAC_HEADER = struct.Struct(">HBBHHH")


MAC_OVERHEAD = MAC_HEADER.size + 4  # 14


_U16 = struct.Struct(">H")


_BEACON = struct.Struct(">HIH")


_GRANT = struct.Struct(">IIBHB")


_BCAST_REF = struct.Struct(">II")


_REPORT = struct.Struct(">IIHhB")


_REPORT_ITEM = struct.Struct(">IIBH")


_JOIN = struct.Struct(">I")


MAX_BCAST_PER_GRANT = 8


class MacType(enum.IntEnum):
    """MAC control frame types."""

    BEACON = 1
    GRANT = 2
    REPORT = 3
    JOIN = 4


class MacFrameError(ValueError):
    """A MAC control frame that does not parse (bad magic, length, CRC, type or body)."""


@dataclass(frozen=True)
class MacFrame:
    """A decoded MAC control frame; ``body`` is parsed by the helpers below."""

    type: MacType
    src: int
    dst: int
    body: bytes


def encode_mac(mtype: MacType, src: int, dst: int, body: bytes = b"") -> bytes:
    """Serialise one MAC control frame."""
    if not (0 <= src <= 0xFFFF and 0 <= dst <= 0xFFFF and len(body) <= 0xFFFF):
        raise ValueError("MAC frame field out of range")
    head = MAC_HEADER.pack(MAC_MAGIC, MAC_VERSION, int(mtype), src, dst, len(body)) + body
    return head + struct.pack(">I", zlib.crc32(head) & 0xFFFFFFFF)


def mac_on_air(mac_raw: bytes, src: int, dst: int) -> bytes:
    """A MAC control frame as it goes on air: the payload of a one-fragment link DATA frame with
    msg_id MAC_MSG_ID, so it passes every PHY chain that carries link frames (frame_parser)."""
    return encode_frame(FrameType.DATA, src, dst, MAC_MSG_ID, 0, 1, mac_raw)


def is_mac_frame(raw: bytes) -> bool:
    """Whether ``raw`` is a link DATA frame carrying a MAC control frame (not yet CRC-checked)."""
    return (
        len(raw) >= 22
        and _U16.unpack_from(raw)[0] == FRAME_MAGIC
        and raw[3] == FrameType.DATA
        and struct.unpack_from(">I", raw, 8)[0] == MAC_MSG_ID
    )


def mac_from_air(raw: bytes) -> MacFrame:
    """Check the link frame around a MAC control frame, then the MAC frame itself."""
    try:
        frame = decode_frame(raw)
    except FrameError as exc:
        raise MacFrameError(f"MAC carrier frame: {exc}") from exc
    if frame.msg_id != MAC_MSG_ID or frame.count != 1:
        raise MacFrameError("not a MAC carrier frame")
    f = decode_mac(frame.payload)
    if (f.src, f.dst) != (frame.src, frame.dst):
        raise MacFrameError("MAC and carrier addresses differ")
    return f


def decode_mac(raw: bytes) -> MacFrame:
    """Parse and check one MAC control frame; raise MacFrameError when malformed."""
    raw = bytes(raw)
    if len(raw) < MAC_OVERHEAD:
        raise MacFrameError("MAC frame too short")
    magic, version, mtype, src, dst, n = MAC_HEADER.unpack_from(raw)
    if magic != MAC_MAGIC or version != MAC_VERSION:
        raise MacFrameError("bad MAC magic or version")
    if len(raw) != MAC_OVERHEAD + n:
        raise MacFrameError("MAC length mismatch")
    (crc,) = struct.unpack_from(">I", raw, MAC_HEADER.size + n)
    if zlib.crc32(raw[: MAC_HEADER.size + n]) & 0xFFFFFFFF != crc:
        raise MacFrameError("MAC CRC mismatch")
    if mtype not in MacType._value2member_map_:
        raise MacFrameError(f"unknown MAC type {mtype}")
    return MacFrame(MacType(mtype), src, dst, raw[MAC_HEADER.size : MAC_HEADER.size + n])


def _beacon_body(slots: int, slot_s: float, admitted: list[int]) -> bytes:
    return _BEACON.pack(slots, int(round(slot_s * 1e6)), len(admitted)) + b"".join(
        _U16.pack(a) for a in admitted
    )


def _parse_beacon(body: bytes) -> tuple[int, float, list[int]]:
    if len(body) < _BEACON.size:
        raise MacFrameError("BEACON too short")
    slots, slot_us, k = _BEACON.unpack_from(body)
    if len(body) != _BEACON.size + 2 * k:
        raise MacFrameError("BEACON length mismatch")
    ids = [_U16.unpack_from(body, _BEACON.size + 2 * i)[0] for i in range(k)]
    return slots, slot_us * 1e-6, ids


@dataclass(frozen=True)
class Grant:
    """A decoded GRANT body: ``mcs`` None when the PHY has one rate."""

    seq: int
    budget: int
    mcs: int | None
    bcasts: list[tuple[int, int]]
    heard: int | None = None


def _grant_body(
    seq: int,
    budget: int,
    bcasts: list[tuple[int, int]],
    mcs: int | None = None,
    heard: int | None = None,
) -> bytes:
    m = NO_MCS if mcs is None else int(mcs)
    if not (m == NO_MCS or 0 <= m < len(MCS_TABLE)):
        raise ValueError(f"GRANT mcs {mcs} is not in the MCS table")
    h = HEARD_UNKNOWN if heard is None else min(int(heard), HEARD_UNKNOWN - 1)
    head = _GRANT.pack(seq, budget, m, h, len(bcasts))
    return head + b"".join(_BCAST_REF.pack(*b) for b in bcasts)


def _parse_grant(body: bytes) -> Grant:
    if len(body) < _GRANT.size:
        raise MacFrameError("GRANT too short")
    seq, budget, mcs, heard, k = _GRANT.unpack_from(body)
    if k > MAX_BCAST_PER_GRANT or len(body) != _GRANT.size + k * _BCAST_REF.size:
        raise MacFrameError("GRANT length mismatch")
    if mcs != NO_MCS and mcs >= len(MCS_TABLE):
        raise MacFrameError(f"GRANT names MCS {mcs}, not in table version {MCS_TABLE_VERSION}")
    refs = [_BCAST_REF.unpack_from(body, _GRANT.size + i * _BCAST_REF.size) for i in range(k)]
    return Grant(
        seq,
        budget,
        None if mcs == NO_MCS else mcs,
        [(int(m), int(c)) for m, c in refs],
        None if heard == HEARD_UNKNOWN else heard,
    )


@dataclass(frozen=True)
class BcastStatus:
    """A robot's state of one broadcast message: complete, or the bitmap it has received."""

    msg_id: int
    count: int
    complete: bool
    received: bytes  # MSB-first bitmap of ``count`` bits (empty when complete)

    def missing(self) -> list[int]:
        """Fragment indices not received."""
        if self.complete:
            return []
        out = []
        for i in range(self.count):
            byte = i >> 3
            if byte >= len(self.received) or not self.received[byte] & (0x80 >> (i & 7)):
                out.append(i)
        return out


@dataclass(frozen=True)
class Report:
    """A decoded REPORT body: ``snr_db`` None when the robot measured none."""

    seq: int
    backlog: int
    sent: int
    snr_db: float | None
    items: list[BcastStatus]


def _snr_q(snr_db: float | None) -> int:
    if snr_db is None or not math.isfinite(snr_db):
        return NO_SNR
    lo, hi = SNR_RANGE_DB
    return int(round(min(max(float(snr_db), lo), hi) * 4))


def _report_body(
    seq: int,
    backlog: int,
    items: list[BcastStatus],
    sent: int = 0,
    snr_db: float | None = None,
) -> bytes:
    head = _REPORT.pack(
        seq, min(backlog, 0xFFFFFFFF), min(sent, 0xFFFF), _snr_q(snr_db), len(items)
    )
    parts = [head]
    for it in items:
        bm = b"" if it.complete else it.received
        parts.append(_REPORT_ITEM.pack(it.msg_id, it.count, int(it.complete), len(bm)) + bm)
    return b"".join(parts)


def _parse_report(body: bytes) -> Report:
    if len(body) < _REPORT.size:
        raise MacFrameError("REPORT too short")
    seq, backlog, sent, snr_q, k = _REPORT.unpack_from(body)
    if k > MAX_BCAST_PER_GRANT:
        raise MacFrameError("REPORT lists too many broadcasts")
    snr_db = None
    if snr_q != NO_SNR:
        snr_db = snr_q / 4.0
        if not SNR_RANGE_DB[0] <= snr_db <= SNR_RANGE_DB[1]:
            raise MacFrameError(f"REPORT SNR {snr_db} dB out of range")
    off = _REPORT.size
    items = []
    for _ in range(k):
        if len(body) < off + _REPORT_ITEM.size:
            raise MacFrameError("REPORT item truncated")
        msg_id, count, complete, m = _REPORT_ITEM.unpack_from(body, off)
        off += _REPORT_ITEM.size
        if complete > 1 or count < 1 or (complete and m) or m > (count + 7) // 8:
            raise MacFrameError("bad REPORT item")
        if len(body) < off + m:
            raise MacFrameError("REPORT bitmap truncated")
        items.append(BcastStatus(msg_id, count, bool(complete), body[off : off + m]))
        off += m
    if off != len(body):
        raise MacFrameError("REPORT trailing bytes")
    return Report(seq, backlog, sent, snr_db, items)
