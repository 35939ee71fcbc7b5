"""Selective-repeat ARQ over link frames, transport-agnostic and free of threads.

An ArqEndpoint fragments outgoing messages into DATA frames, paces them (window of frames in
flight and an optional token bucket in bytes per second), retransmits fragments that the peer's
ACK bitmaps report missing (fast retransmit) or that time out (exponential backoff), and fails a
send explicitly after its deadline. Incoming DATA frames are reassembled, acknowledged with
compact bitmaps and delivered exactly once; a short memory of completed messages makes late
retransmissions re-ACKed but not re-delivered.

ACK payload (frame type ACK, src = receiver, dst = sender, msg_id of the message, seq 0, count 1),
big-endian::

    off size field
    0   1    flags: bit0 COMPLETE (every fragment received); other bits 0
    1   4    count: fragment count of the acknowledged message (echo)
    5   4    base: every fragment with seq < base has been received
    9   2    n: bitmap length in bytes
    11  n    bitmap, MSB-first: bit i set = fragment base + i received; bits >= count are 0

NACK payload: u8 reason, u32 count (echo). Reasons: 1 TOO_LARGE and 2 REFUSED (the receiver
will never take the message: the send fails), 3 RESET (the receiver dropped its partial copy
after eviction or timeout: the sender forgets all acknowledgements and sends every fragment
again). ACKs are cumulative: a fragment once acknowledged is not sent again unless a RESET comes.

The endpoint never blocks and never starts threads: the owner calls ``on_frame`` for every frame
off the air, and ``poll`` whenever ``next_deadline`` passes. ``transmit`` is called from inside
``send``/``on_frame``/``poll`` and must not re-enter the endpoint synchronously.
"""

from __future__ import annotations

import enum
import logging
import random
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .fragment import Reassembler, fragment
from .frame import (
    BROADCAST,
    DEFAULT_MTU,
    Frame,
    FrameCrcError,
    FrameError,
    FrameType,
    decode_frame,
    encode_frame,
    max_payload,
)

logger = logging.getLogger(__name__)

ACK_HEADER = struct.Struct(">BIIH")
ACK_HEADER_SIZE = ACK_HEADER.size  # 11
ACK_COMPLETE = 0x01
NACK_PAYLOAD = struct.Struct(">BI")
NACK_TOO_LARGE = 1
NACK_REFUSED = 2
NACK_RESET = 3
_NACK_REASONS = {NACK_TOO_LARGE: "too_large", NACK_REFUSED: "refused", NACK_RESET: "reset"}


class SendStatus(enum.Enum):
    """Outcome of a send."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


@dataclass
class AckInfo:
    """Decoded ACK payload."""

    complete: bool
    count: int
    base: int
    bitmap: bytes

    def covered(self) -> int:
        """One past the highest fragment reported received (padding bits say nothing)."""
        stripped = self.bitmap.rstrip(b"\x00")
        if not stripped:
            return self.base
        last = stripped[-1]
        tail = (last & -last).bit_length() - 1  # trailing zero bits of the last non-zero byte
        return min(self.count, self.base + 8 * len(stripped) - tail)


def encode_ack(info: AckInfo) -> bytes:
    """Serialise an ACK payload (see the module docstring)."""
    flags = ACK_COMPLETE if info.complete else 0
    return ACK_HEADER.pack(flags, info.count, info.base, len(info.bitmap)) + bytes(info.bitmap)


def decode_ack(payload: bytes) -> AckInfo:
    """Parse and validate an ACK payload; raise ValueError when malformed."""
    if len(payload) < ACK_HEADER_SIZE:
        raise ValueError("ACK payload too short")
    flags, count, base, n = ACK_HEADER.unpack_from(payload)
    if flags & ~ACK_COMPLETE:
        raise ValueError(f"unknown ACK flags 0x{flags:02x}")
    if len(payload) != ACK_HEADER_SIZE + n:
        raise ValueError("ACK bitmap length mismatch")
    if count < 1 or base > count:
        raise ValueError(f"ACK base {base} / count {count}")
    bitmap = bytes(payload[ACK_HEADER_SIZE:])
    complete = bool(flags & ACK_COMPLETE)
    if complete and (base != count or n):
        raise ValueError("complete ACK must have base == count and no bitmap")
    if n and base + 8 * n > count:
        extra = base + 8 * n - count  # trailing bits beyond the message must be zero
        if int.from_bytes(bitmap, "big") & ((1 << extra) - 1):
            raise ValueError("ACK bitmap has bits beyond count")
    return AckInfo(complete, count, base, bitmap)


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


@dataclass
class ArqConfig:
    """Tuning of an ArqEndpoint; times in seconds of the endpoint's clock."""

    mtu: int = DEFAULT_MTU
    window: int = 32  # DATA frames in flight (sent, not acknowledged, not deemed lost)
    rate_bytes_per_s: float | None = None  # token-bucket pacing of DATA frames; None = unpaced
    burst_bytes: int = 4 * DEFAULT_MTU  # token bucket depth
    initial_rto: float = 0.5  # retransmission timeout before any RTT sample
    min_rto: float = 0.05
    max_rto: float = 5.0
    backoff: float = 2.0  # RTO multiplier per timeout of the same fragment
    deadline: float = 60.0  # default time a send may take before it fails
    max_retransmissions: int | None = None  # per fragment; None = until the deadline
    reorder_tolerance: int = 3  # frames sent after a missing one before it counts as lost
    ack_every: int = 8  # ACK after this many new fragments
    ack_delay: float = 0.02  # or this long after the first unacknowledged one
    max_message_size: int = 256 * 1024 * 1024 + 64
    reassembly_max_messages: int = 32
    reassembly_max_bytes: int = 300 * 1024 * 1024
    reassembly_timeout: float = 120.0
    completed_memory: int = 1024
    completed_ttl: float = 300.0


@dataclass
class ArqStats:
    """Counters of an ArqEndpoint."""

    data_tx: int = 0  # DATA frames transmitted (first copies and retransmissions)
    retransmissions: int = 0
    fast_retransmissions: int = 0  # retransmissions triggered by an ACK gap
    rto_expiries: int = 0
    acks_tx: int = 0
    acks_rx: int = 0
    nacks_tx: int = 0
    nacks_rx: int = 0
    bad_acks: int = 0
    crc_errors: int = 0
    bad_frames: int = 0
    not_for_us: int = 0
    stale_acks: int = 0  # ACKs for messages no longer being sent
    delivered: int = 0  # messages handed to the application
    sends_delivered: int = 0
    sends_failed: int = 0
    bytes_tx: int = 0

    def as_dict(self) -> dict[str, int]:
        """Counters as a plain dict."""
        return asdict(self)


@dataclass
class SendHandle:
    """Tracks one send: status DELIVERED or FAILED (with a reason) once finished."""

    msg_id: int
    dst: int
    size: int
    count: int
    started: float
    status: SendStatus = SendStatus.PENDING
    reason: str = ""
    finished: float | None = None
    frames_sent: int = 0
    retransmissions: int = 0
    _event: threading.Event = field(default_factory=threading.Event, repr=False)
    _callbacks: list[Callable[[SendHandle], None]] = field(default_factory=list, repr=False)

    def done(self) -> bool:
        """Whether the send has finished (delivered or failed)."""
        return self.status is not SendStatus.PENDING

    def wait(self, timeout: float | None = None) -> bool:
        """Block until finished (for threaded owners); True if finished."""
        return self._event.wait(timeout)

    def add_done_callback(self, fn: Callable[[SendHandle], None]) -> None:
        """Call ``fn(handle)`` once finished (immediately if it already is)."""
        if self.done():
            fn(self)
        else:
            self._callbacks.append(fn)

    @property
    def elapsed(self) -> float | None:
        """Seconds from send to finish, or None while pending."""
        return None if self.finished is None else self.finished - self.started

    def _finish(self, status: SendStatus, reason: str, now: float) -> None:
        self.status = status
        self.reason = reason
        self.finished = now
        self._event.set()
        for fn in self._callbacks:
            try:
                fn(self)
            except Exception:  # a user callback must not break the endpoint
                logger.exception("send callback failed")
        self._callbacks.clear()


class _Outgoing:
    """Sender state of one message."""

    def __init__(self, handle: SendHandle, frames: list[bytes], deadline: float) -> None:
        n = len(frames)
        self.handle = handle
        self.frames = frames
        self.deadline = deadline
        self.acked = np.zeros(n, dtype=np.uint8)
        self.n_acked = 0
        self.cum = 0  # every seq < cum is acknowledged
        self.pending: deque[int] = deque(range(n))
        self.queued = bytearray(b"\x01" * n)
        self.in_flight: dict[int, float] = {}  # seq -> RTO expiry
        self.order = [-1] * n  # transmission order of the latest copy
        self.tx_time = [0.0] * n
        self.copies = [0] * n
        self.timeouts = [0] * n
        self.max_acked_order = -1


class _AckState:
    """Receiver-side ACK scheduling of one partial message."""

    __slots__ = ("new", "due", "last_sent")

    def __init__(self) -> None:
        self.new = 0
        self.due: float | None = None
        self.last_sent = -1e300


class ArqEndpoint:
    """Reliable message transport over an unreliable frame channel (selective-repeat ARQ)."""

    def __init__(
        self,
        node_id: int,
        transmit: Callable[[bytes], None],
        clock: Callable[[], float] = time.monotonic,
        config: ArqConfig | None = None,
        on_message: Callable[[int, bytes], None] | None = None,
        msg_id_start: int | None = None,
        **overrides: float | int | None,
    ) -> None:
        if not 0 <= node_id < BROADCAST:
            raise ValueError(f"node id must be in 0..{BROADCAST - 1}")
        cfg = replace(config or ArqConfig(), **overrides)
        if cfg.window < 1 or cfg.ack_every < 1 or cfg.backoff < 1.0:
            raise ValueError("window and ack_every must be >= 1, backoff >= 1")
        self.node_id = node_id
        self.transmit = transmit
        self.clock = clock
        self.config = cfg
        self.on_message = on_message
        self.stats = ArqStats()
        self.reassembler = Reassembler(
            max_messages=cfg.reassembly_max_messages,
            max_bytes=cfg.reassembly_max_bytes,
            timeout=cfg.reassembly_timeout,
            completed_memory=cfg.completed_memory,
            completed_ttl=cfg.completed_ttl,
            clock=clock,
            mtu=cfg.mtu,
            on_drop=self._on_reassembly_drop,
        )
        self._inbox: deque[tuple[int, bytes]] = deque()
        self._out: OrderedDict[tuple[int, int], _Outgoing] = OrderedDict()
        self._acks: dict[tuple[int, int], _AckState] = {}
        self._reacks: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._next_id = random.getrandbits(32) if msg_id_start is None else msg_id_start
        self._order = 0
        self._in_flight = 0
        self._rtt: dict[int, tuple[float, float]] = {}
        self._tokens = float(cfg.burst_bytes)
        self._tokens_at = clock()
        self._ack_max = max_payload(cfg.mtu) - ACK_HEADER_SIZE
        self._broadcast_keys: set[tuple[int, int]] = set()

    # -- public API ------------------------------------------------------------------------
    def send(self, dst: int, payload: bytes, deadline: float | None = None) -> SendHandle:
        """Queue a message for reliable delivery to ``dst``; ``deadline`` in seconds from now."""
        if not 0 <= dst < BROADCAST or dst == self.node_id:
            raise ValueError(f"cannot send reliably to node {dst}")
        if len(payload) > self.config.max_message_size:
            raise ValueError(f"message of {len(payload)} bytes exceeds max_message_size")
        now = self.clock()
        msg_id = self._next_id
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        frames = fragment(payload, msg_id, self.node_id, dst, self.config.mtu)
        handle = SendHandle(msg_id, dst, len(payload), len(frames), now)
        limit = self.config.deadline if deadline is None else deadline
        self._out[(dst, msg_id)] = _Outgoing(handle, frames, now + limit)
        logger.debug(
            "send %d bytes to %d as msg %d (%d frames)", len(payload), dst, msg_id, len(frames)
        )
        self.poll()
        return handle

    def receive(self) -> tuple[int, bytes] | None:
        """Pop the oldest delivered (src, payload) when no on_message callback is set."""
        return self._inbox.popleft() if self._inbox else None

    def cancel(self, handle: SendHandle, reason: str = "cancelled") -> None:
        """Fail a pending send now."""
        o = self._out.get((handle.dst, handle.msg_id))
        if o is not None:
            self._finish(o, SendStatus.FAILED, reason, self.clock())

    def cancel_all(self, reason: str = "cancelled") -> None:
        """Fail every pending send now (e.g. when the link closes)."""
        now = self.clock()
        for o in list(self._out.values()):
            self._finish(o, SendStatus.FAILED, reason, now)

    @property
    def pending_sends(self) -> int:
        """Number of sends not yet finished."""
        return len(self._out)

    def on_frame(self, raw: bytes) -> None:
        """Process one raw frame off the air (DATA, ACK or NACK); bad frames are counted."""
        try:
            frame = decode_frame(raw, self.config.mtu)
        except FrameCrcError:
            self.stats.crc_errors += 1
            return
        except FrameError:
            self.stats.bad_frames += 1
            return
        if frame.src == self.node_id or (frame.dst != self.node_id and frame.dst != BROADCAST):
            self.stats.not_for_us += 1
            return
        now = self.clock()
        if frame.type == FrameType.DATA:
            self._on_data(frame, now)
        elif frame.type == FrameType.ACK:
            self._on_ack(frame, now)
        else:
            self._on_nack(frame, now)
        self._pump(now)

    def poll(self) -> None:
        """Run timers: deadlines, retransmission timeouts, delayed ACKs, pacing, reassembly."""
        now = self.clock()
        self.reassembler.expire(now)
        for o in list(self._out.values()):
            if now >= o.deadline:
                self._finish(o, SendStatus.FAILED, "deadline", now)
                continue
            for seq, expiry in list(o.in_flight.items()):
                if now >= expiry:
                    del o.in_flight[seq]
                    self._in_flight -= 1
                    o.timeouts[seq] += 1
                    self.stats.rto_expiries += 1
                    limit = self.config.max_retransmissions
                    if limit is not None and o.copies[seq] > limit:
                        self._finish(o, SendStatus.FAILED, "max_retransmissions", now)
                        break
                    self._requeue(o, seq, front=True)
        for key, st in list(self._acks.items()):
            if st.due is not None and now >= st.due:
                self._send_ack(key, now)
        self._pump(now)

    def next_deadline(self) -> float | None:
        """Earliest clock time at which ``poll`` has work to do, or None when idle."""
        times: list[float] = []
        rd = self.reassembler.next_deadline()
        if rd is not None:
            times.append(rd)
        times.extend(st.due for st in self._acks.values() if st.due is not None)
        sendable = False
        for o in self._out.values():
            times.append(o.deadline)
            if o.in_flight:
                times.append(min(o.in_flight.values()))
            if o.pending:
                sendable = True
        if sendable and self._in_flight < self.config.window:
            rate = self.config.rate_bytes_per_s
            if rate:
                need = self._next_frame_len() - self._tokens
                times.append(self._tokens_at + max(0.0, need) / rate)
            else:
                times.append(self.clock())
        return min(times) if times else None

    @property
    def idle(self) -> bool:
        """True when nothing is being sent and no ACK is owed."""
        return not self._out and not any(st.due is not None for st in self._acks.values())

    # -- receiver side ---------------------------------------------------------------------
    def _on_data(self, frame: Frame, now: float) -> None:
        key = (frame.src, frame.msg_id)
        ra = self.reassembler
        was_done = ra.is_completed(*key)
        dups = ra.stats.duplicates
        if frame.dst == BROADCAST:
            self._broadcast_keys.add(key)
        done = ra.push(frame)
        if frame.dst == BROADCAST:  # unacknowledged broadcast: deliver, never ACK
            if done is not None or ra.progress(*key) is None:
                self._broadcast_keys.discard(key)
            if done is not None:
                self._deliver(done.src, done.payload)
            return
        if done is not None:
            self._acks.pop(key, None)
            self._deliver(done.src, done.payload)
            self._send_complete_ack(key, frame.count, now)
            return
        if was_done:
            last = self._reacks.get(key, -1e300)
            if now - last >= self.config.ack_delay:
                self._send_complete_ack(key, frame.count, now)
            return
        if ra.progress(*key) is None:
            return  # rejected or dropped; a NACK went out from the drop callback if needed
        st = self._acks.setdefault(key, _AckState())
        if ra.stats.duplicates > dups:  # sender retransmits what we hold: our ACK was lost
            if now - st.last_sent >= self.config.ack_delay:
                self._send_ack(key, now)
            return
        st.new += 1
        if st.new >= self.config.ack_every:
            self._send_ack(key, now)
        elif st.due is None:
            st.due = now + self.config.ack_delay

    def _send_ack(self, key: tuple[int, int], now: float) -> None:
        st = self._acks.get(key)
        bm = self.reassembler.bitmap(*key)
        prog = self.reassembler.progress(*key)
        if bm is None or prog is None:
            self._acks.pop(key, None)
            return
        info = ack_from_bitmap(bm, prog[1], self._ack_max)
        self._tx_control(FrameType.ACK, key[0], key[1], encode_ack(info))
        self.stats.acks_tx += 1
        if st is not None:
            st.new = 0
            st.due = None
            st.last_sent = now

    def _send_complete_ack(self, key: tuple[int, int], count: int, now: float) -> None:
        self._tx_control(
            FrameType.ACK, key[0], key[1], encode_ack(AckInfo(True, count, count, b""))
        )
        self.stats.acks_tx += 1
        self._reacks[key] = now
        self._reacks.move_to_end(key)
        while len(self._reacks) > max(1, self.config.completed_memory):
            self._reacks.popitem(last=False)

    def _on_reassembly_drop(self, key: tuple[int, int], reason: str, count: int) -> None:
        self._acks.pop(key, None)
        code = NACK_TOO_LARGE if reason == "too_large" else NACK_RESET
        if key in self._broadcast_keys:
            self._broadcast_keys.discard(key)
        else:
            payload = NACK_PAYLOAD.pack(code, count)
            self._tx_control(FrameType.NACK, key[0], key[1], payload)
            self.stats.nacks_tx += 1
        logger.info("reassembly of message %d from node %d dropped: %s", key[1], key[0], reason)

    def _deliver(self, src: int, payload: bytes) -> None:
        self.stats.delivered += 1
        if self.on_message is not None:
            try:
                self.on_message(src, payload)
            except Exception:
                logger.exception("on_message callback failed")
        else:
            self._inbox.append((src, payload))

    # -- sender side -----------------------------------------------------------------------
    def _on_ack(self, frame: Frame, now: float) -> None:
        o = self._out.get((frame.src, frame.msg_id))
        if o is None:
            self.stats.stale_acks += 1
            return
        try:
            info = decode_ack(frame.payload)
        except ValueError as exc:
            self.stats.bad_acks += 1
            logger.debug("bad ACK from %d: %s", frame.src, exc)
            return
        n = len(o.frames)
        if info.count != n:
            self.stats.bad_acks += 1
            return
        self.stats.acks_rx += 1
        if info.complete:
            for seq in np.nonzero(o.acked == 0)[0].tolist():
                self._mark_acked(o, seq, now)
            self._finish(o, SendStatus.DELIVERED, "", now)
            return
        if info.base > o.cum:
            for seq in (np.nonzero(o.acked[o.cum : info.base] == 0)[0] + o.cum).tolist():
                self._mark_acked(o, seq, now)
            o.cum = info.base
        end = info.covered()
        if end > info.base:
            bits = np.unpackbits(np.frombuffer(info.bitmap, dtype=np.uint8))[: end - info.base]
            got = np.nonzero(bits)[0] + info.base
            for seq in got[o.acked[got] == 0].tolist():
                self._mark_acked(o, seq, now)
        if o.n_acked == n:
            self._finish(o, SendStatus.DELIVERED, "", now)
            return
        tol = self.config.reorder_tolerance
        for seq in [s for s in o.in_flight if s < end]:
            if o.order[seq] + tol < o.max_acked_order:
                del o.in_flight[seq]
                self._in_flight -= 1
                self.stats.fast_retransmissions += 1
                self._requeue(o, seq, front=True)

    def _on_nack(self, frame: Frame, now: float) -> None:
        o = self._out.get((frame.src, frame.msg_id))
        if o is None or len(frame.payload) != NACK_PAYLOAD.size:
            self.stats.stale_acks += 1
            return
        code, _ = NACK_PAYLOAD.unpack(frame.payload)
        self.stats.nacks_rx += 1
        if code == NACK_RESET:
            logger.info("node %d reset msg %d: sending it again", frame.src, frame.msg_id)
            o.acked[:] = 0
            o.n_acked = 0
            o.cum = 0
            for seq in range(len(o.frames)):
                self._requeue(o, seq, front=False)
            return
        why = _NACK_REASONS.get(code, f"code {code}")
        self._finish(o, SendStatus.FAILED, f"rejected by receiver: {why}", now)

    def _mark_acked(self, o: _Outgoing, seq: int, now: float) -> None:
        if o.acked[seq]:
            return
        o.acked[seq] = 1
        o.n_acked += 1
        if seq in o.in_flight:
            del o.in_flight[seq]
            self._in_flight -= 1
        if o.order[seq] > o.max_acked_order:
            o.max_acked_order = o.order[seq]
        if o.copies[seq] == 1:  # Karn: RTT samples only from fragments sent once
            self._rtt_sample(o.handle.dst, now - o.tx_time[seq])

    def _rtt_sample(self, dst: int, sample: float) -> None:
        prev = self._rtt.get(dst)
        if prev is None:
            self._rtt[dst] = (sample, sample / 2)
        else:
            srtt, var = prev
            var = 0.75 * var + 0.25 * abs(srtt - sample)
            srtt = 0.875 * srtt + 0.125 * sample
            self._rtt[dst] = (srtt, var)

    def _rto(self, dst: int) -> float:
        prev = self._rtt.get(dst)
        cfg = self.config
        base = cfg.initial_rto if prev is None else prev[0] + 4 * prev[1] + cfg.ack_delay
        return min(cfg.max_rto, max(cfg.min_rto, base))

    def _requeue(self, o: _Outgoing, seq: int, front: bool) -> None:
        if o.acked[seq] or o.queued[seq]:
            return
        o.queued[seq] = 1
        if front:
            o.pending.appendleft(seq)
        else:
            o.pending.append(seq)

    def _pump(self, now: float) -> None:
        """Transmit queued fragments while the window and the token bucket allow."""
        cfg = self.config
        rate = cfg.rate_bytes_per_s
        if rate:
            self._tokens = min(cfg.burst_bytes, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        progress = True
        while progress and self._in_flight < cfg.window:
            progress = False
            for o in list(self._out.values()):  # one frame per message per pass: fair sharing
                if self._in_flight >= cfg.window:
                    break
                seq = self._next_pending(o)
                if seq is None:
                    continue
                frame = o.frames[seq]
                if rate and self._tokens < len(frame) - 1e-6:
                    o.pending.appendleft(seq)
                    o.queued[seq] = 1
                    return
                self._tokens -= len(frame) if rate else 0
                self._transmit_data(o, seq, now)
                progress = True

    def _next_frame_len(self) -> int:
        """Length of the frame the pump would send next (the MTU when unknown)."""
        for o in self._out.values():
            for seq in o.pending:
                if not o.acked[seq] and seq not in o.in_flight:
                    return len(o.frames[seq])
        return self.config.mtu

    def _next_pending(self, o: _Outgoing) -> int | None:
        while o.pending:
            seq = o.pending.popleft()
            o.queued[seq] = 0
            if not o.acked[seq] and seq not in o.in_flight:
                return seq
        return None

    def _transmit_data(self, o: _Outgoing, seq: int, now: float) -> None:
        frame = o.frames[seq]
        o.copies[seq] += 1
        if o.copies[seq] > 1:
            self.stats.retransmissions += 1
            o.handle.retransmissions += 1
        o.order[seq] = self._order
        self._order += 1
        o.tx_time[seq] = now
        rto = self._rto(o.handle.dst) * self.config.backoff ** o.timeouts[seq]
        o.in_flight[seq] = now + min(rto, self.config.max_rto)
        self._in_flight += 1
        o.handle.frames_sent += 1
        self.stats.data_tx += 1
        self.stats.bytes_tx += len(frame)
        self.transmit(frame)

    def _tx_control(self, ftype: FrameType, dst: int, msg_id: int, payload: bytes) -> None:
        raw = encode_frame(ftype, self.node_id, dst, msg_id, 0, 1, payload, self.config.mtu)
        self.stats.bytes_tx += len(raw)
        self.transmit(raw)

    def _finish(self, o: _Outgoing, status: SendStatus, reason: str, now: float) -> None:
        key = (o.handle.dst, o.handle.msg_id)
        if self._out.pop(key, None) is None:
            return
        self._in_flight -= len(o.in_flight)
        o.in_flight.clear()
        if status is SendStatus.DELIVERED:
            self.stats.sends_delivered += 1
        else:
            self.stats.sends_failed += 1
            logger.warning("send of msg %d to node %d failed: %s", key[1], key[0], reason)
        o.handle._finish(status, reason, now)
