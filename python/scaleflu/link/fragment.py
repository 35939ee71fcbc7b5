"""Fragmentation of messages into link frames and bounded-memory reassembly.

The reassembler copes with loss, duplicates, reordering and interleaved messages from several
senders (key = (src, msg_id)); its memory is bounded by a number of messages, a number of bytes
and a per-message inactivity timeout, and it exposes the bitmap of received fragments for ARQ.
Bitmaps are MSB-first: fragment i is bit ``0x80 >> (i % 8)`` of byte ``i // 8``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .frame import (
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

Key = tuple[int, int]
DEFAULT_MAX_MESSAGES = 32
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_FRAGMENTS = 1 << 20
DEFAULT_COMPLETED_MEMORY = 1024
DEFAULT_COMPLETED_TTL = 120.0


def fragment_count(length: int, mtu: int = DEFAULT_MTU) -> int:
    """Number of frames a message of ``length`` bytes needs (at least one, even when empty)."""
    return max(1, math.ceil(length / max_payload(mtu)))


def fragment(
    message: bytes, msg_id: int, src: int, dst: int, mtu: int = DEFAULT_MTU
) -> list[bytes]:
    """Split a message into encoded DATA frames of at most ``mtu`` bytes each."""
    mp = max_payload(mtu)
    count = fragment_count(len(message), mtu)
    if count > 0xFFFFFFFF:
        raise ValueError("message needs more than 2**32-1 fragments")
    view = memoryview(bytes(message))
    return [
        encode_frame(FrameType.DATA, src, dst, msg_id, i, count, view[i * mp : (i + 1) * mp], mtu)
        for i in range(count)
    ]


def bitmap_get(bitmap: bytes | bytearray, i: int) -> bool:
    """Whether bit i of an MSB-first bitmap is set."""
    return bool(bitmap[i >> 3] & (0x80 >> (i & 7)))


@dataclass
class ReassemblerStats:
    """Counters of a reassembler (all monotonic)."""

    frames_ok: int = 0  # new DATA fragments stored
    duplicates: int = 0  # fragments already held, or of a recently completed message
    crc_errors: int = 0  # raw frames failing the CRC (push_raw)
    bad_frames: int = 0  # raw frames failing other checks (push_raw)
    not_data: int = 0  # ACK/NACK frames handed to the reassembler and ignored
    inconsistent: int = 0  # fragments whose count disagrees with their message
    rejected: int = 0  # messages larger than max_fragments or max_bytes
    evictions: int = 0  # partial messages dropped to respect max_messages / max_bytes
    timeouts: int = 0  # partial messages dropped after the inactivity timeout
    completed: int = 0  # messages reassembled

    def as_dict(self) -> dict[str, int]:
        """Counters as a plain dict (for logs and JSON)."""
        return asdict(self)


@dataclass(frozen=True)
class CompletedMessage:
    """A reassembled message."""

    src: int
    dst: int
    msg_id: int
    payload: bytes


class _Partial:
    """State of a message being reassembled."""

    __slots__ = ("count", "dst", "frags", "bitmap", "received", "nbytes", "created", "updated")

    def __init__(self, count: int, dst: int, now: float) -> None:
        self.count = count
        self.dst = dst
        self.frags: dict[int, bytes] = {}
        self.bitmap = bytearray((count + 7) // 8)
        self.received = 0
        self.nbytes = len(self.bitmap)
        self.created = now
        self.updated = now


class Reassembler:
    """Collects DATA frames into messages with bounded memory (messages, bytes, timeout)."""

    def __init__(
        self,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        max_fragments: int = DEFAULT_MAX_FRAGMENTS,
        completed_memory: int = DEFAULT_COMPLETED_MEMORY,
        completed_ttl: float = DEFAULT_COMPLETED_TTL,
        clock: Callable[[], float] = time.monotonic,
        mtu: int = DEFAULT_MTU,
        on_drop: Callable[[Key, str, int], None] | None = None,
    ) -> None:
        if max_messages < 1 or max_bytes < 1 or timeout <= 0 or max_fragments < 1:
            raise ValueError("reassembler limits must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.max_fragments = max_fragments
        self.completed_memory = completed_memory
        self.completed_ttl = completed_ttl
        self.clock = clock
        self.mtu = mtu
        self.on_drop = on_drop
        self.stats = ReassemblerStats()
        self._partials: OrderedDict[Key, _Partial] = OrderedDict()  # oldest first
        self._done: OrderedDict[Key, float] = OrderedDict()  # recently completed, oldest first
        self._bytes = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def messages_in_flight(self) -> int:
        """Number of partial messages held."""
        return len(self._partials)

    @property
    def bytes_in_flight(self) -> int:
        """Bytes held by partial messages (payloads + bitmaps)."""
        return self._bytes

    def bitmap(self, src: int, msg_id: int) -> bytes | None:
        """MSB-first bitmap of received fragments of a partial message, or None if not held."""
        p = self._partials.get((src, msg_id))
        return None if p is None else bytes(p.bitmap)

    def progress(self, src: int, msg_id: int) -> tuple[int, int] | None:
        """(fragments received, fragment count) of a partial message, or None if not held."""
        p = self._partials.get((src, msg_id))
        return None if p is None else (p.received, p.count)

    def is_completed(self, src: int, msg_id: int) -> bool:
        """Whether (src, msg_id) completed recently (its late duplicates are not re-delivered)."""
        return (src, msg_id) in self._done

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest partial message times out, or None."""
        if not self._partials:
            return None
        return min(p.updated for p in self._partials.values()) + self.timeout

    # -- input -----------------------------------------------------------------------------
    def push_raw(self, raw: bytes) -> CompletedMessage | None:
        """Decode raw bytes and push the frame; CRC and format errors are counted, not raised."""
        try:
            frame = decode_frame(raw, self.mtu)
        except FrameCrcError:
            self.stats.crc_errors += 1
            return None
        except FrameError:
            self.stats.bad_frames += 1
            return None
        return self.push(frame)

    def push(self, frame: Frame) -> CompletedMessage | None:
        """Store one decoded DATA frame; return the message when this frame completes it."""
        now = self.clock()
        self.expire(now)
        if frame.type != FrameType.DATA:
            self.stats.not_data += 1
            return None
        key = (frame.src, frame.msg_id)
        if key in self._done:
            self.stats.duplicates += 1
            return None
        p = self._partials.get(key)
        if p is None:
            p = self._start(key, frame, now)
            if p is None:
                return None
        elif frame.count != p.count:
            self.stats.inconsistent += 1
            return None
        if p.bitmap[frame.seq >> 3] & (0x80 >> (frame.seq & 7)):
            self.stats.duplicates += 1
            return None
        size = len(frame.payload)
        if not self._make_room(size, key):
            return None
        p.frags[frame.seq] = frame.payload
        p.bitmap[frame.seq >> 3] |= 0x80 >> (frame.seq & 7)
        p.received += 1
        p.nbytes += size
        p.updated = now
        self._bytes += size
        self.stats.frames_ok += 1
        if p.received < p.count:
            return None
        payload = b"".join(p.frags[i] for i in range(p.count))
        self._remove(key)
        self._remember(key, now)
        self.stats.completed += 1
        return CompletedMessage(frame.src, p.dst, frame.msg_id, payload)

    def expire(self, now: float | None = None) -> list[Key]:
        """Drop partial messages idle longer than the timeout and stale completion memory."""
        now = self.clock() if now is None else now
        dead = [k for k, p in self._partials.items() if now - p.updated >= self.timeout]
        for k in dead:
            self._drop(k, "timeout")
            self.stats.timeouts += 1
        while self._done:
            k, t = next(iter(self._done.items()))
            if now - t < self.completed_ttl:
                break
            del self._done[k]
        return dead

    def discard(self, src: int, msg_id: int) -> bool:
        """Forget a partial message (e.g. the sender gave up); True if one was held."""
        if (src, msg_id) in self._partials:
            self._remove((src, msg_id))
            return True
        return False

    # -- internals -------------------------------------------------------------------------
    def _start(self, key: Key, frame: Frame, now: float) -> _Partial | None:
        """Create state for a new message, rejecting ones that can never fit."""
        est = (frame.count - 1) * len(frame.payload) if frame.seq < frame.count - 1 else 0
        if frame.count > self.max_fragments or est + (frame.count + 7) // 8 > self.max_bytes:
            self.stats.rejected += 1
            if self.on_drop:
                self.on_drop(key, "too_large", frame.count)
            return None
        while len(self._partials) >= self.max_messages:
            oldest = next(iter(self._partials))
            self._drop(oldest, "evicted")
            self.stats.evictions += 1
        p = _Partial(frame.count, frame.dst, now)
        self._partials[key] = p
        self._bytes += p.nbytes
        return p

    def _make_room(self, size: int, key: Key) -> bool:
        """Evict the oldest other messages until ``size`` more bytes fit; False if impossible."""
        while self._bytes + size > self.max_bytes:
            victim = next((k for k in self._partials if k != key), None)
            if victim is None:
                self._drop(key, "too_large")
                self.stats.rejected += 1
                return False
            self._drop(victim, "evicted")
            self.stats.evictions += 1
        return True

    def _remove(self, key: Key) -> None:
        p = self._partials.pop(key)
        self._bytes -= p.nbytes

    def _drop(self, key: Key, reason: str) -> None:
        logger.debug("dropping partial message %s: %s", key, reason)
        count = self._partials[key].count
        self._remove(key)
        if self.on_drop:
            self.on_drop(key, reason, count)

    def _remember(self, key: Key, now: float) -> None:
        if self.completed_memory <= 0:
            return
        self._done[key] = now
        self._done.move_to_end(key)
        while len(self._done) > self.completed_memory:
            self._done.popitem(last=False)
