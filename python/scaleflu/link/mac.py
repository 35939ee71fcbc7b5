"""A server-scheduled MAC for one shared frequency, with a NORM-style broadcast downlink.

Pure Python, no threads, clock injectable: the same objects run in real time under a link
(``MacLink``-style owners call ``on_frame``/``poll`` as frames and timers arrive) and in virtual
time in the frame-level simulator (``scaleflu.link.macsim``). The MAC sits between an
:class:`~scaleflu.link.arq.ArqEndpoint` and the frame transport: it takes over the endpoint's
``transmit`` callable (frames the ARQ wants on air go into a MAC queue) and sorts what comes off
the air (its own control frames; link frames go on to ``endpoint.on_frame``). arq.py is unchanged.

Rules (docs/link.md, "MAC"):

* The **server** (:class:`MacServer`) owns the medium. It alternates a downlink burst (its queued
  link frames: broadcasts, unicast DATA, ACKs of the robots' uploads) with one GRANT to one robot.
  After a GRANT it stays silent until the robot's REPORT ends the granted burst or the grant's
  window (turnaround + the budget's airtime + guard) has passed: a robot that does not answer
  costs one window, then it is polled with exponential backoff.
* A **robot** (:class:`MacStation`) transmits only after it decodes a GRANT addressed to it:
  queued link frames (ACKs of the downlink first, then DATA) up to the grant's byte budget,
  then a REPORT (backlog left, and for every broadcast named in the grant: complete, or the
  bitmap of fragments received). No clock synchronisation: everything a robot sends is timed
  from the end of the grant it heard.
* **Registration** is the one contention access: the server's BEACON opens ``slots`` slots;
  a robot that is not yet a member sends JOIN in a random slot; the next BEACON lists the
  robots admitted; a robot not listed retries after a random binary-exponential backoff.
* **Broadcast downlink**: :meth:`MacServer.broadcast` puts a message on air once, addressed to
  BROADCAST (the ArqEndpoints of the robots reassemble and deliver it, they never ACK it).
  Robots report what they miss in their REPORTs; once every unconfirmed target has been polled
  since the last pass, the server broadcasts the union of the missing fragments once more
  (NORM, RFC 5740, without FEC), until every target confirmed or the deadline passed. The
  handle records each target's progress (fragments it reported, repair passes since it last
  gained one: :meth:`BroadcastHandle.stalled`); the owner may hand a stalled target over to a
  unicast (:meth:`BroadcastHandle.abandon`), and the broadcast then goes on for the others.

MAC control frame (big-endian). On air it is the payload of a one-fragment link DATA frame with
msg_id 0xFFFFFFFF (``mac_on_air``), so every PHY chain that carries link frames carries it too
(the C++ frame_parser included); other link frames pass through to the ARQ untouched::

    off size field
    0   2    magic 0x534D ("SM")
    2   1    version = 1
    3   1    type: 1 BEACON, 2 GRANT, 3 REPORT, 4 JOIN
    4   2    src node id
    6   2    dst node id (0xFFFF = all)
    8   2    n: body length
    10  n    body
    10+n 4   crc32 over bytes 0 .. 10+n-1

    BEACON  u16 slots, u32 slot_us, u16 k, k x u16 admitted ids
    GRANT   u32 grant seq, u32 budget bytes, u8 k, k x (u32 msg_id, u32 count) broadcasts to report
    REPORT  u32 grant seq, u32 backlog bytes, u8 k, k x (u32 msg_id, u32 count, u8 complete,
            u16 m, m bytes: bitmap of fragments received, MSB first)
    JOIN    u32 nonce
"""

from __future__ import annotations

import enum
import logging
import random
import struct
import threading
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

from .arq import ArqEndpoint
from .fragment import fragment
from .frame import (
    BROADCAST,
    FRAME_MAGIC,
    FRAME_OVERHEAD,
    RESERVED_MSG_ID,
    FrameError,
    FrameType,
    decode_frame,
    encode_frame,
)

logger = logging.getLogger(__name__)

MAC_MAGIC = 0x534D
MAC_MSG_ID = RESERVED_MSG_ID  # link DATA frames with this msg_id carry MAC control frames
MAC_VERSION = 1
MAC_HEADER = struct.Struct(">HBBHHH")
MAC_OVERHEAD = MAC_HEADER.size + 4  # 14
_U16 = struct.Struct(">H")
_BEACON = struct.Struct(">HIH")
_GRANT = struct.Struct(">IIB")
_BCAST_REF = struct.Struct(">II")
_REPORT = struct.Struct(">IIB")
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


def _under_mac(endpoint: ArqEndpoint) -> None:
    """Settings of an ArqEndpoint that the MAC wraps: its frames wait in the MAC's queue for a
    grant, so the time since the ARQ handed a frame over says nothing about whether it went on
    air, and an ACK one RTT later does not prove it lost (``ArqConfig.rack_rtt`` off)."""
    if endpoint.config.rack_rtt:
        endpoint.config = replace(endpoint.config, rack_rtt=False)


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


def _grant_body(seq: int, budget: int, bcasts: list[tuple[int, int]]) -> bytes:
    return _GRANT.pack(seq, budget, len(bcasts)) + b"".join(_BCAST_REF.pack(*b) for b in bcasts)


def _parse_grant(body: bytes) -> tuple[int, int, list[tuple[int, int]]]:
    if len(body) < _GRANT.size:
        raise MacFrameError("GRANT too short")
    seq, budget, k = _GRANT.unpack_from(body)
    if k > MAX_BCAST_PER_GRANT or len(body) != _GRANT.size + k * _BCAST_REF.size:
        raise MacFrameError("GRANT length mismatch")
    refs = [_BCAST_REF.unpack_from(body, _GRANT.size + i * _BCAST_REF.size) for i in range(k)]
    return seq, budget, [(int(m), int(c)) for m, c in refs]


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


def _report_body(seq: int, backlog: int, items: list[BcastStatus]) -> bytes:
    parts = [_REPORT.pack(seq, min(backlog, 0xFFFFFFFF), len(items))]
    for it in items:
        bm = b"" if it.complete else it.received
        parts.append(_REPORT_ITEM.pack(it.msg_id, it.count, int(it.complete), len(bm)) + bm)
    return b"".join(parts)


def _parse_report(body: bytes) -> tuple[int, int, list[BcastStatus]]:
    if len(body) < _REPORT.size:
        raise MacFrameError("REPORT too short")
    seq, backlog, k = _REPORT.unpack_from(body)
    if k > MAX_BCAST_PER_GRANT:
        raise MacFrameError("REPORT lists too many broadcasts")
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
    return seq, backlog, items


@dataclass
class MacConfig:
    """Timing of the MAC; times in seconds of the owner's clock, sizes in bytes."""

    # The OFDM PHY at 5 MS/s (FFT 64, CP 16, BPSK header, QPSK payload, 160 zeros of padding):
    # scaleflu.radio.links.samples_per_frame(n) = 452 + 6.685 n samples, i.e. 90 us + n / 748 kB/s
    # (720 samples for a 40-byte ACK, 10 480 for a 1500-byte frame).
    rate_bytes_per_s: float = 748000.0  # PHY bytes per second on air
    preamble_s: float = 90e-6  # per frame on air beyond its bytes (preamble, header symbols)
    turnaround_s: float = 1e-3  # a robot's RX -> TX time after it decodes its grant
    guard_s: float = 2e-3  # margin added to every grant window and contention slot
    grant_bytes: int = 96 * 1024  # uplink budget of one grant (link frames)
    downlink_bytes: int = 96 * 1024  # server burst between two grants
    idle_poll_s: float = 0.5  # poll a robot with nothing to say this often
    max_poll_interval_s: float = 8.0  # backoff cap for robots that do not answer
    # A missed grant is retried after miss_retry_s (about one fade) this many times before the
    # exponential backoff starts:
    # on a fading channel a robot in a fade misses a grant or two (a 2 Hz Rician fade lasts
    # about 0.1-0.3 s); backing off 0.5, 1, 2 s at once stretched a round from 1.5 to 26 s.
    quick_retries: int = 3
    miss_retry_s: float = 0.15
    beacon_interval_s: float = 1.0  # BEACON (registration) period
    contention_slots: int = 8  # JOIN slots after each BEACON (0: registration closed)
    join_backoff_exp: int = 6  # robots skip up to 2**min(attempts, this) - 1 beacons
    max_members: int = 1024
    report_bitmap_bytes: int = 1400  # a REPORT's bitmap of one broadcast at most

    def airtime(self, nbytes: int) -> float:
        """Seconds one frame of ``nbytes`` occupies the medium."""
        return self.preamble_s + nbytes / self.rate_bytes_per_s

    def __post_init__(self) -> None:
        if self.rate_bytes_per_s <= 0 or self.grant_bytes < 64 or self.downlink_bytes < 64:
            raise ValueError("MAC rate and budgets must be positive (budgets >= 64 bytes)")
        if min(self.preamble_s, self.turnaround_s, self.guard_s) < 0:
            raise ValueError("MAC times must be >= 0")
        if self.quick_retries < 0 or self.miss_retry_s < 0:
            raise ValueError("quick_retries and miss_retry_s must be >= 0")
        if self.contention_slots < 0 or self.contention_slots > 0xFFFF:
            raise ValueError("contention_slots must be in 0..65535")


@dataclass
class MacStats:
    """Counters of a MAC endpoint (bytes are frame bytes handed to the PHY)."""

    beacons_tx: int = 0
    grants_tx: int = 0
    grant_timeouts: int = 0
    reports_tx: int = 0
    reports_rx: int = 0
    joins_tx: int = 0
    joins_rx: int = 0
    admitted: int = 0
    link_frames_tx: int = 0
    link_bytes_tx: int = 0
    control_bytes_tx: int = 0
    control_bytes_rx: int = 0  # MAC frames received (server: REPORTs and JOINs)
    queued_duplicates: int = 0  # ARQ retransmissions replacing a copy still in the MAC queue
    bcast_passes: int = 0
    bcast_frames_tx: int = 0
    bcast_bytes_tx: int = 0
    bcast_repair_frames: int = 0
    bcast_abandoned: int = 0  # broadcast targets the owner handed over to a unicast
    bad_frames: int = 0
    not_for_us: int = 0

    def as_dict(self) -> dict[str, int]:
        """Counters as a plain dict."""
        return asdict(self)


def _frame_key(raw: bytes) -> tuple[int, ...] | None:
    """(type, src, dst, msg_id, seq) of a link frame, for de-duplication in the MAC queue."""
    if len(raw) < 16 or _U16.unpack_from(raw)[0] != FRAME_MAGIC:
        return None
    return (raw[3], *struct.unpack_from(">HHII", raw, 4))


class _TxQueue:
    """Link frames waiting for air time: control (ACK/NACK) first, then DATA; one copy per key."""

    def __init__(self, stats: MacStats) -> None:
        self._ctl: deque[bytes] = deque()
        self._data: OrderedDict[tuple[int, ...] | int, bytes] = OrderedDict()
        self._n = 0
        self.stats = stats

    def put(self, raw: bytes) -> None:
        key = _frame_key(raw)
        if key is not None and key[0] != FrameType.DATA:
            self._ctl.append(raw)
            return
        if key is None:
            self._n += 1
            key = self._n
        elif key in self._data:
            self.stats.queued_duplicates += 1
        self._data[key] = raw

    def pop_upto(self, budget: int) -> list[bytes]:
        out: list[bytes] = []
        used = 0
        while self._ctl and used + len(self._ctl[0]) <= budget:
            raw = self._ctl.popleft()
            used += len(raw)
            out.append(raw)
        while self._data:
            key, raw = next(iter(self._data.items()))
            if used + len(raw) > budget:
                break
            del self._data[key]
            used += len(raw)
            out.append(raw)
        return out

    @property
    def nbytes(self) -> int:
        return sum(map(len, self._ctl)) + sum(map(len, self._data.values()))

    def __len__(self) -> int:
        return len(self._ctl) + len(self._data)


def _bitmap_missing(bitmap: bytes | None, count: int) -> list[int]:
    if bitmap is None:
        return list(range(count))
    return BcastStatus(0, count, False, bitmap).missing()


class BroadcastHandle:
    """One broadcast message: which targets confirmed it, and when it finished."""

    def __init__(self, msg_id: int, count: int, size: int, targets: set[int], started: float):
        self.msg_id = msg_id
        self.count = count
        self.size = size
        self.targets = set(targets)
        self.confirmed: set[int] = set()
        self.started = started
        self.finished: float | None = None
        self.reason = ""
        self.passes = 0
        self.frames_sent = 0
        # per target progress (the MAC's clock): when the first pass was all on air, the most
        # fragments each target reported holding, when that last grew, and the repair passes
        # queued since then; targets handed over to a unicast (abandon) are no longer served
        self.pass_out: float | None = None
        self.received: dict[int, int] = {}
        self.last_progress: dict[int, float] = {}
        self.passes_since: dict[int, int] = {}
        self._pass_at_report: dict[int, int] = {}  # target -> passes queued at its last REPORT
        self.abandoned: set[int] = set()
        self._abandon_req: set[int] = set()
        self._lock = threading.Lock()
        self._event = threading.Event()

    def done(self) -> bool:
        """Finished: every target confirmed (or handed over), or the deadline passed."""
        return self.finished is not None

    @property
    def ok(self) -> bool:
        """Every target confirmed the message, except those handed over (:meth:`abandon`)."""
        return self.confirmed >= self.targets - self.abandoned

    def open_targets(self) -> set[int]:
        """Targets the broadcast still serves: not confirmed, not handed over."""
        return self.targets - self.confirmed - self.abandoned

    def stalled(self, robot: int, now: float, max_passes: int, max_s: float) -> str | None:
        """Why ``robot``'s repair has stalled, or None: after the first pass was on air, its
        REPORTs after ``max_passes`` repair passes showed no new fragment, or it gained none for
        ``max_s`` seconds of the MAC's clock (``now``: that clock). A robot that does not answer
        its grants (no REPORT) stalls on the time only; one that answers but keeps missing what
        is repaired, on the passes.
        """
        if self.done() or robot not in self.open_targets() or self.pass_out is None:
            return None
        n = self.passes_since.get(robot, 0)
        held = f"{self.received.get(robot, 0)}/{self.count} fragments"
        if n >= max_passes:
            return f"{n} repair passes without progress, {held}"
        since = self.last_progress.get(robot, self.pass_out)
        if now - since >= max_s:
            return f"no progress for {now - since:.1f} s, {held}"
        return None

    def abandon(self, robot: int) -> None:
        """Stop serving ``robot`` (its owner sends it the message another way); thread-safe:
        the MAC applies it at its next schedule, and finishes the broadcast when every other
        target has confirmed."""
        with self._lock:
            if robot in self.targets:
                self._abandon_req.add(robot)

    def _take_abandoned(self) -> set[int]:
        with self._lock:
            req, self._abandon_req = self._abandon_req, set()
        req -= self.abandoned | self.confirmed
        self.abandoned |= req
        return req

    def _note_report(self, robot: int, got: int, now: float) -> None:
        """A REPORT said ``robot`` holds ``got`` fragments: progress when that grew; a report
        after a repair pass that brought it nothing counts one pass without progress (passes
        while it was not heard from do not: they may have reached it)."""
        seen = self._pass_at_report.get(robot, 1)
        self._pass_at_report[robot] = self.passes
        if got > self.received.get(robot, 0):
            self.received[robot] = got
            self.last_progress[robot] = now
            self.passes_since[robot] = 0
        elif self.passes > seen:
            self.passes_since[robot] = self.passes_since.get(robot, 0) + 1

    def wait(self, timeout: float | None = None) -> bool:
        """Block until finished (threaded owners)."""
        return self._event.wait(timeout)

    def _finish(self, now: float, reason: str) -> None:
        if self.finished is None:
            self.finished = now
            self.reason = reason
            self._event.set()


class _Bcast:
    def __init__(self, handle: BroadcastHandle, frames: list[bytes], deadline: float) -> None:
        self.h = handle
        self.frames = frames
        self.deadline = deadline
        self.unsent = 0  # frames of the current pass still in the server queue
        self.awaiting: set[int] = set()  # unconfirmed targets not yet polled since the pass
        self.missing: set[int] = set()


@dataclass
class _Member:
    robot: int
    backlog: int = 0
    want: bool = True  # has something for us or owes us something: poll soon
    missed: int = 0
    next_poll: float = 0.0
    joined: float = 0.0


@dataclass
class _Grant:
    robot: int
    seq: int
    expires: float
    bcasts: list[int] = field(default_factory=list)


class MacServer:
    """The scheduler on the server (see the module docstring)."""

    def __init__(
        self,
        endpoint: ArqEndpoint,
        phy_transmit: Callable[[bytes], None],
        config: MacConfig | None = None,
        members: Iterable[int] = (),
        seed: int | None = None,
    ) -> None:
        self.ep = endpoint
        _under_mac(endpoint)
        self.node_id = endpoint.node_id
        self.clock = endpoint.clock
        self.config = config or MacConfig()
        self.phy_transmit = phy_transmit
        self.stats = MacStats()
        self.rng = random.Random(seed)
        self.members: dict[int, _Member] = {}
        self._order: deque[int] = deque()
        self._q = _TxQueue(self.stats)
        self._bq: deque[tuple[_Bcast, bytes]] = deque()  # broadcast frames, before unicast
        self._bcasts: dict[int, _Bcast] = {}
        self._grant: _Grant | None = None
        self._grant_seq = self.rng.getrandbits(31)
        self._bcast_id = self.rng.getrandbits(32) % MAC_MSG_ID  # never the MAC's own id
        self._air_until = self.clock()
        self._quiet_until = 0.0
        self._next_beacon = self.clock()
        self._admitted: list[int] = []
        self.on_member: Callable[[int], None] | None = None
        endpoint.transmit = self._q.put
        for r in members:
            self._admit(r, announce=False)

    # -- owner API -------------------------------------------------------------------------
    def on_frame(self, raw: bytes) -> None:
        """One frame off the air: MAC control handled here, link frames go to the ARQ."""
        raw = bytes(raw)
        now = self.clock()
        if is_mac_frame(raw):
            self.stats.control_bytes_rx += len(raw)
            try:
                f = mac_from_air(raw)
                if f.dst not in (self.node_id, BROADCAST) or f.src == self.node_id:
                    self.stats.not_for_us += 1
                elif f.type is MacType.REPORT:
                    self._on_report(f, now)
                elif f.type is MacType.JOIN:
                    self._on_join(f)
                else:
                    self.stats.not_for_us += 1
            except MacFrameError as exc:
                self.stats.bad_frames += 1
                logger.debug("bad MAC frame: %s", exc)
        else:
            key = _frame_key(raw)
            if key is not None and key[1] in self.members:
                m = self.members[key[1]]
                m.missed = 0
            self.ep.on_frame(raw)
        self._schedule(now)

    def poll(self) -> None:
        """Run the ARQ's timers, then the schedule."""
        self.ep.poll()
        self._schedule(self.clock())

    def next_deadline(self) -> float | None:
        """Earliest clock time at which ``poll`` has work."""
        times = [t for t in (self.ep.next_deadline(), self._mac_deadline()) if t is not None]
        return min(times) if times else None

    def add_member(self, robot: int) -> None:
        """Admit a robot without JOIN (a configured membership)."""
        self._admit(robot, announce=False)

    def broadcast(
        self, payload: bytes, targets: Iterable[int], deadline: float = 60.0
    ) -> BroadcastHandle:
        """Send ``payload`` once to every target (a multicast); repair what they report missing."""
        now = self.clock()
        targets = {int(t) for t in targets}
        unknown = targets - set(self.members)
        if unknown:
            raise ValueError(f"robots {sorted(unknown)} are not members of the MAC")
        msg_id = self._bcast_id
        self._bcast_id = (self._bcast_id + 1) % MAC_MSG_ID
        frames = fragment(payload, msg_id, self.node_id, BROADCAST, self.ep.config.mtu)
        h = BroadcastHandle(msg_id, len(frames), len(payload), targets, now)
        b = _Bcast(h, frames, now + deadline)
        self._bcasts[msg_id] = b
        if not targets:
            h._finish(now, "no targets")
            return h
        self._queue_pass(b, range(len(frames)))
        self._schedule(now)
        return h

    def remove_member(self, robot: int) -> None:
        """Stop polling a robot."""
        self.members.pop(robot, None)
        if robot in self._order:
            self._order.remove(robot)

    @property
    def busy(self) -> bool:
        """Something queued, a grant open or a broadcast unfinished."""
        return bool(self._q) or bool(self._bq) or self._grant is not None or bool(self._bcasts)

    # -- internals -------------------------------------------------------------------------
    def _admit(self, robot: int, announce: bool = True) -> None:
        if robot in self.members or robot in (self.node_id, BROADCAST):
            return
        if len(self.members) >= self.config.max_members:
            logger.warning("MAC full: JOIN of %d ignored", robot)
            return
        self.members[robot] = _Member(robot, joined=self.clock())
        self._order.append(robot)
        self.stats.admitted += 1
        if announce:
            self._admitted.append(robot)
        if self.on_member is not None:
            self.on_member(robot)

    def _queue_pass(self, b: _Bcast, seqs: Iterable[int]) -> None:
        n = 0
        for s in seqs:
            self._bq.append((b, b.frames[s]))
            n += 1
        b.unsent += n
        b.h.passes += 1
        self.stats.bcast_passes += 1
        if b.h.passes > 1:
            self.stats.bcast_repair_frames += n

    def _tx(self, raw: bytes, control: bool) -> None:
        now = self.clock()
        self._air_until = max(now, self._air_until) + self.config.airtime(len(raw))
        if control:
            self.stats.control_bytes_tx += len(raw)
        else:
            self.stats.link_frames_tx += 1
            self.stats.link_bytes_tx += len(raw)
        self.phy_transmit(raw)

    def _on_join(self, f: MacFrame) -> None:
        if len(f.body) != _JOIN.size:
            raise MacFrameError("JOIN length")
        self.stats.joins_rx += 1
        if f.src in self.members:  # it missed the BEACON that admitted it
            self._admitted.append(f.src)
        self._admit(f.src)

    def _on_report(self, f: MacFrame, now: float) -> None:
        seq, backlog, items = _parse_report(f.body)
        m = self.members.get(f.src)
        if m is None:
            self.stats.not_for_us += 1
            return
        self.stats.reports_rx += 1
        m.backlog = backlog
        m.missed = 0
        m.want = backlog > 0
        m.next_poll = now + self.config.idle_poll_s
        for it in items:
            b = self._bcasts.get(it.msg_id)
            if b is None or it.count != b.h.count or f.src not in b.h.targets:
                continue
            b.awaiting.discard(f.src)
            if f.src in b.h.abandoned:  # handed over to a unicast: its gaps are not repaired
                self._bcast_progress(b, now)
                continue
            if it.complete:
                b.h.confirmed.add(f.src)
                b.h._note_report(f.src, b.h.count, now)
            else:
                gaps = it.missing()
                b.missing.update(gaps)
                b.h._note_report(f.src, b.h.count - len(gaps), now)
            self._bcast_progress(b, now)
        g = self._grant
        if g is not None and g.robot == f.src and g.seq == seq:
            self._grant = None

    def _bcast_progress(self, b: _Bcast, now: float) -> None:
        h = b.h
        if h.done():
            return
        if h.ok:
            h._finish(now, "delivered")
            self._bcasts.pop(h.msg_id, None)
            return
        if b.unsent or b.awaiting:
            return
        unconfirmed = h.open_targets()
        if b.missing:
            self._queue_pass(b, sorted(b.missing))
            b.missing = set()
        else:  # nobody reported a gap (silent robots): poll them again
            b.awaiting = set(unconfirmed)
            for r in unconfirmed:
                if r in self.members:
                    self.members[r].want = True

    def _mac_deadline(self) -> float | None:
        now = self.clock()
        times = [b.deadline for b in self._bcasts.values()]
        if self._grant is not None:
            times.append(self._grant.expires)
            return min(times)
        if self._q or self._bq:
            times.append(max(now, self._quiet_until))
        if self.config.contention_slots:
            times.append(self._next_beacon)
        for m in self.members.values():
            times.append(max(self._quiet_until, now if m.want and not m.missed else m.next_poll))
        return min(times) if times else None

    def _schedule(self, now: float) -> None:
        cfg = self.config
        for b in list(self._bcasts.values()):
            if now >= b.deadline and not b.h.done():
                b.h._finish(now, "deadline")
                self._bcasts.pop(b.h.msg_id, None)
                continue
            gone = b.h._take_abandoned()
            if gone:  # targets the owner now serves by unicast
                self.stats.bcast_abandoned += len(gone)
                b.awaiting -= gone
                self._bcast_progress(b, now)
        g = self._grant
        if g is not None:
            if now < g.expires:
                return
            self._grant = None
            self.stats.grant_timeouts += 1
            m = self.members.get(g.robot)
            if m is not None:
                m.missed += 1
                if m.missed <= cfg.quick_retries:
                    back = cfg.miss_retry_s
                else:
                    k = m.missed - cfg.quick_retries - 1
                    back = min(cfg.max_poll_interval_s, cfg.idle_poll_s * 2**k)
                m.next_poll = now + back
            for mid in g.bcasts:
                b = self._bcasts.get(mid)
                if b is not None:
                    b.awaiting.discard(g.robot)
                    self._bcast_progress(b, now)
        if now < self._quiet_until:
            return
        # downlink burst: broadcast frames, then unicast frames and ACKs of the ARQ
        used = 0
        while self._bq and used < cfg.downlink_bytes:
            b, raw = self._bq.popleft()
            b.unsent -= 1
            if b.h.done():
                continue
            self._tx(raw, control=False)
            used += len(raw)
            b.h.frames_sent += 1
            self.stats.bcast_frames_tx += 1
            self.stats.bcast_bytes_tx += len(raw)
            if b.unsent == 0:
                if b.h.pass_out is None:
                    b.h.pass_out = now  # the first pass is on air: stall times count from here
                b.awaiting = b.h.open_targets()
                for r in b.awaiting:
                    if r in self.members:
                        self.members[r].want = True
        for raw in self._q.pop_upto(max(0, cfg.downlink_bytes - used)):
            key = _frame_key(raw)
            if key is not None and key[2] in self.members:
                self.members[key[2]].want = True  # it owes us ACKs: poll it soon
            self._tx(raw, control=key is None or key[0] != FrameType.DATA)
        if cfg.contention_slots and now >= self._next_beacon:
            self._send_beacon(now)
            return
        r = self._pick(now)
        if r is not None:
            self._send_grant(r, now)

    def _send_beacon(self, now: float) -> None:
        cfg = self.config
        slot = cfg.airtime(FRAME_OVERHEAD + MAC_OVERHEAD + _JOIN.size) + cfg.guard_s
        admitted, self._admitted = self._admitted[:600], self._admitted[600:]
        raw = mac_on_air(
            encode_mac(
                MacType.BEACON,
                self.node_id,
                BROADCAST,
                _beacon_body(cfg.contention_slots, slot, admitted),
            ),
            self.node_id,
            BROADCAST,
        )
        self._tx(raw, control=True)
        self.stats.beacons_tx += 1
        self._next_beacon = now + cfg.beacon_interval_s
        self._quiet_until = (
            self._air_until + cfg.turnaround_s + cfg.contention_slots * slot + cfg.guard_s
        )

    def _pick(self, now: float) -> int | None:
        """Next robot to grant: round robin over robots with work, then idle ones due a poll."""
        n = len(self._order)
        due = None
        for i in range(n):
            r = self._order[i]
            m = self.members[r]
            if m.missed:
                if now >= m.next_poll and due is None:
                    due = i
                continue
            if m.want or m.backlog:
                self._order.rotate(-(i + 1))
                return r
            if now >= m.next_poll and due is None:
                due = i
        if due is None:
            return None
        r = self._order[due]
        self._order.rotate(-(due + 1))
        return r

    def _send_grant(self, r: int, now: float) -> None:
        cfg = self.config
        m = self.members[r]
        refs = [b for b in self._bcasts.values() if r in b.h.open_targets() and b.unsent == 0][
            :MAX_BCAST_PER_GRANT
        ]
        self._grant_seq = (self._grant_seq + 1) & 0xFFFFFFFF
        body = _grant_body(
            self._grant_seq, cfg.grant_bytes, [(b.h.msg_id, b.h.count) for b in refs]
        )
        raw = mac_on_air(encode_mac(MacType.GRANT, self.node_id, r, body), self.node_id, r)
        self._tx(raw, control=True)
        self.stats.grants_tx += 1
        mtu = self.ep.config.mtu
        frames = cfg.grant_bytes // mtu + 2
        report = (
            MAC_OVERHEAD + _REPORT.size + len(refs) * (_REPORT_ITEM.size + cfg.report_bitmap_bytes)
        )
        window = (
            cfg.turnaround_s
            + (cfg.grant_bytes + report) / cfg.rate_bytes_per_s
            + frames * cfg.preamble_s
            + cfg.guard_s
        )
        self._grant = _Grant(
            r, self._grant_seq, self._air_until + window, [b.h.msg_id for b in refs]
        )
        m.want = False
        m.next_poll = now + cfg.idle_poll_s


class MacStation:
    """A robot's MAC: sends only inside its grants; joins by contention (module docstring)."""

    def __init__(
        self,
        endpoint: ArqEndpoint,
        phy_transmit: Callable[[bytes], None],
        config: MacConfig | None = None,
        server_id: int = 0,
        joined: bool = False,
        seed: int | None = None,
    ) -> None:
        self.ep = endpoint
        _under_mac(endpoint)
        self.node_id = endpoint.node_id
        self.clock = endpoint.clock
        self.config = config or MacConfig()
        self.server_id = server_id
        self.phy_transmit = phy_transmit
        self.stats = MacStats()
        self.rng = random.Random(seed)
        self.joined = joined
        self.join_attempts = 0
        self._skip = 0
        self._join_at: float | None = None
        self._join_pending = False
        self._q = _TxQueue(self.stats)
        self._nonce = self.rng.getrandbits(32)
        endpoint.transmit = self._q.put

    def on_frame(self, raw: bytes) -> None:
        """One frame off the air: the server's BEACON/GRANT here, link frames to the ARQ."""
        raw = bytes(raw)
        if not is_mac_frame(raw):
            self.ep.on_frame(raw)
            return
        try:
            f = mac_from_air(raw)
        except MacFrameError as exc:
            self.stats.bad_frames += 1
            logger.debug("bad MAC frame: %s", exc)
            return
        if f.src != self.server_id or f.dst not in (self.node_id, BROADCAST):
            self.stats.not_for_us += 1
            return
        try:
            if f.type is MacType.BEACON:
                self._on_beacon(f)
            elif f.type is MacType.GRANT and f.dst == self.node_id:
                self._on_grant(f)
            else:
                self.stats.not_for_us += 1
        except MacFrameError as exc:
            self.stats.bad_frames += 1
            logger.debug("bad MAC frame body: %s", exc)

    def poll(self) -> None:
        """ARQ timers; a JOIN due in its contention slot."""
        self.ep.poll()
        if self._join_at is not None and self.clock() >= self._join_at:
            self._join_at = None
            raw = mac_on_air(
                encode_mac(MacType.JOIN, self.node_id, self.server_id, _JOIN.pack(self._nonce)),
                self.node_id,
                self.server_id,
            )
            self._tx(raw, control=True)
            self.stats.joins_tx += 1
            self._join_pending = True
            self.join_attempts += 1

    def next_deadline(self) -> float | None:
        """Earliest clock time at which ``poll`` has work."""
        times = [t for t in (self.ep.next_deadline(), self._join_at) if t is not None]
        return min(times) if times else None

    @property
    def backlog(self) -> int:
        """Bytes waiting for a grant (plus 1 while the ARQ has an unfinished send)."""
        return self._q.nbytes + (1 if self.ep.pending_sends else 0)

    def _tx(self, raw: bytes, control: bool) -> None:
        if control:
            self.stats.control_bytes_tx += len(raw)
        else:
            self.stats.link_frames_tx += 1
            self.stats.link_bytes_tx += len(raw)
        self.phy_transmit(raw)

    def _on_beacon(self, f: MacFrame) -> None:
        slots, slot_s, admitted = _parse_beacon(f.body)
        if self.node_id in admitted:
            if not self.joined:
                logger.info(
                    "robot %d joined the MAC after %d JOINs", self.node_id, self.join_attempts
                )
            self.joined = True
            self._join_at = None
            self._join_pending = False
            return
        if self.joined or slots == 0:
            return
        if self._join_pending:  # our JOIN was not admitted: collided or lost
            self._join_pending = False
            self._skip = self.rng.randrange(
                2 ** min(self.join_attempts, self.config.join_backoff_exp)
            )
        if self._skip > 0:
            self._skip -= 1
            return
        slot = self.rng.randrange(slots)
        self._join_at = self.clock() + self.config.turnaround_s + slot * slot_s

    def _on_grant(self, f: MacFrame) -> None:
        seq, budget, refs = _parse_grant(f.body)
        self.joined = True  # a grant is proof of membership
        self._join_at = None
        self._join_pending = False
        self.ep.poll()  # owed ACKs and due retransmissions join the queue first
        for raw in self._q.pop_upto(budget):
            key = _frame_key(raw)
            self._tx(raw, control=key is None or key[0] != FrameType.DATA)
        items = []
        ra = self.ep.reassembler
        for msg_id, count in refs:
            if ra.is_completed(self.server_id, msg_id):
                items.append(BcastStatus(msg_id, count, True, b""))
                continue
            bm = ra.bitmap(self.server_id, msg_id) or b""
            bm = bm[: min((count + 7) // 8, self.config.report_bitmap_bytes)]
            items.append(BcastStatus(msg_id, count, False, bm))
        raw = mac_on_air(
            encode_mac(
                MacType.REPORT, self.node_id, self.server_id, _report_body(seq, self.backlog, items)
            ),
            self.node_id,
            self.server_id,
        )
        self._tx(raw, control=True)
        self.stats.reports_tx += 1
