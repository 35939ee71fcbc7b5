"""Fragmentation of messages into link frames and bounded-memory reassembly.

The reassembler copes with loss, duplicates, reordering and interleaved messages from several
senders (key = (src, msg_id)); its memory is bounded by a number of messages, a number of bytes
and a per-message inactivity timeout, and it exposes the bitmap of received fragments for ARQ.
Bitmaps are MSB-first: fragment i is bit ``0x80 >> (i % 8)`` of byte ``i // 8``.
"""

from __future__ import annotations

import logging
import math
import mmap
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
MMAP_THRESHOLD = 1 << 20  # partial-message buffers of this size and more are anonymous mmaps


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
    busy: int = 0  # new messages refused: no room that this sender may take (quotas)
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
    """State of a message being reassembled.

    Fragments are copied into one buffer allocated when the first fragment other than the last
    arrives (all but the last fragment carry the same number of bytes ``flen``), so the whole
    reservation ``count * flen`` is charged to the sender's quota up front, completion costs one
    copy, and the memory goes back to the system in one piece when the message is dropped.
    """

    __slots__ = (
        "count",
        "dst",
        "src",
        "trusted",
        "buf",
        "total",
        "flen",
        "last",
        "bitmap",
        "received",
        "nbytes",
        "created",
        "updated",
    )

    def __init__(self, src: int, count: int, dst: int, trusted: bool, now: float) -> None:
        self.src = src
        self.count = count
        self.dst = dst
        self.trusted = trusted
        self.buf: bytearray | mmap.mmap | None = None
        self.total = -1  # message length once the last fragment is in
        self.flen = -1  # bytes of every fragment but the last; -1 until known
        self.last: bytes | None = None  # the last fragment while the buffer is not allocated
        self.bitmap = bytearray((count + 7) // 8)
        self.received = 0
        self.nbytes = len(self.bitmap)
        self.created = now
        self.updated = now


class Reassembler:
    """Collects DATA frames into messages with bounded memory (messages, bytes, timeout).

    Bounds hold in total and per sender (``max_messages_per_sender``,
    ``max_bytes_per_sender``). A partial message is charged its whole size (fragment count x
    fragment length) as soon as that is known. Frames pushed with ``trusted=True`` (the ARQ does
    this for senders authenticated with a link key) have priority: an untrusted sender can only
    evict its own or other untrusted partial messages, never a trusted one, and the memory of
    completed messages is kept apart for trusted and untrusted senders so that a flood of
    untrusted messages cannot make a trusted sender's retransmission count as new. Untrusted
    partial messages (keyless senders, broadcasts) together hold at most
    ``max_bytes_untrusted``, however many senders there are: a larger one is refused
    (``too_large``), and a new one evicts the oldest untrusted ones to fit.
    """

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
        max_messages_per_sender: int | None = None,
        max_bytes_per_sender: int | None = None,
        max_bytes_untrusted: int | None = None,
    ) -> None:
        if max_messages < 1 or max_bytes < 1 or timeout <= 0 or max_fragments < 1:
            raise ValueError("reassembler limits must be positive")
        if max_bytes_untrusted is not None and max_bytes_untrusted < 1:
            raise ValueError("max_bytes_untrusted must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_bytes_untrusted = min(max_bytes, max_bytes_untrusted or max_bytes)
        self.max_messages_per_sender = min(max_messages, max_messages_per_sender or max_messages)
        self.max_bytes_per_sender = min(max_bytes, max_bytes_per_sender or max_bytes)
        if self.max_messages_per_sender < 1 or self.max_bytes_per_sender < 1:
            raise ValueError("per-sender reassembly limits must be positive")
        self.timeout = timeout
        self.max_fragments = max_fragments
        self.completed_memory = completed_memory
        self.completed_ttl = completed_ttl
        self.clock = clock
        self.mtu = mtu
        self.on_drop = on_drop
        self.stats = ReassemblerStats()
        self._partials: OrderedDict[Key, _Partial] = OrderedDict()  # oldest first
        # recently completed keys, oldest first: [untrusted, trusted]
        self._done: tuple[OrderedDict[Key, float], OrderedDict[Key, float]] = (
            OrderedDict(),
            OrderedDict(),
        )
        self._bytes = 0
        self._untrusted_bytes = 0  # reserved by untrusted partial messages
        self._by_sender: dict[int, list[int]] = {}  # src -> [messages, bytes]

    # -- queries ---------------------------------------------------------------------------
    @property
    def messages_in_flight(self) -> int:
        """Number of partial messages held."""
        return len(self._partials)

    @property
    def bytes_in_flight(self) -> int:
        """Bytes reserved by partial messages (buffers + bitmaps)."""
        return self._bytes

    @property
    def untrusted_bytes(self) -> int:
        """Bytes reserved by untrusted partial messages (at most ``max_bytes_untrusted``)."""
        return self._untrusted_bytes

    def sender_usage(self, src: int) -> tuple[int, int]:
        """(partial messages, bytes reserved) held for sender ``src``."""
        m, b = self._by_sender.get(src, (0, 0))
        return m, b

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
        key = (src, msg_id)
        return key in self._done[1] or key in self._done[0]

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest partial message times out, or None."""
        if not self._partials:
            return None
        return min(p.updated for p in self._partials.values()) + self.timeout

    # -- input -----------------------------------------------------------------------------
    def push_raw(self, raw: bytes, trusted: bool = False) -> CompletedMessage | None:
        """Decode raw bytes and push the frame; CRC and format errors are counted, not raised."""
        try:
            frame = decode_frame(raw, self.mtu)
        except FrameCrcError:
            self.stats.crc_errors += 1
            return None
        except FrameError:
            self.stats.bad_frames += 1
            return None
        return self.push(frame, trusted)

    def push(self, frame: Frame, trusted: bool = False) -> CompletedMessage | None:
        """Store one decoded DATA frame; return the message when this frame completes it."""
        now = self.clock()
        self.expire(now)
        if frame.type != FrameType.DATA:
            self.stats.not_data += 1
            return None
        key = (frame.src, frame.msg_id)
        if key in self._done[1] or key in self._done[0]:
            self.stats.duplicates += 1
            return None
        p = self._partials.get(key)
        if p is None:
            if frame.count == 1:  # a whole message in one frame: nothing to hold
                return self._complete(key, frame.dst, bytes(frame.payload), trusted, now)
            p = self._start(key, frame, trusted, now)
            if p is None:
                return None
        elif frame.count != p.count or (trusted and not p.trusted):
            # a trusted sender's frame never joins a message an untrusted one started
            self.stats.inconsistent += 1
            return None
        seq = frame.seq
        if p.bitmap[seq >> 3] & (0x80 >> (seq & 7)):
            self.stats.duplicates += 1
            return None
        size = len(frame.payload)
        is_last = seq == p.count - 1
        if p.buf is None:
            if is_last:
                p.last = bytes(frame.payload)
            else:
                if p.last is not None and len(p.last) > size:
                    self.stats.inconsistent += 1
                    return None
                if not self._allocate(key, p, size):
                    return None
        if p.buf is not None:
            if (not is_last and size != p.flen) or (is_last and size > p.flen):
                self.stats.inconsistent += 1
                return None
            off = seq * p.flen
            p.buf[off : off + size] = frame.payload
            if is_last:
                p.total = off + size
        p.bitmap[seq >> 3] |= 0x80 >> (seq & 7)
        p.received += 1
        p.updated = now
        self.stats.frames_ok += 1
        if p.received < p.count:
            return None
        with memoryview(p.buf) as view:
            payload = bytes(view[: p.total])  # the one copy; the buffer is released below
        self._remove(key)
        return self._complete(key, p.dst, payload, p.trusted, now)

    def expire(self, now: float | None = None) -> list[Key]:
        """Drop partial messages idle longer than the timeout and stale completion memory."""
        now = self.clock() if now is None else now
        dead = [k for k, p in self._partials.items() if now - p.updated >= self.timeout]
        for k in dead:
            self._drop(k, "timeout")
            self.stats.timeouts += 1
        for done in self._done:
            while done:
                k, t = next(iter(done.items()))
                if now - t < self.completed_ttl:
                    break
                del done[k]
        return dead

    def discard(self, src: int, msg_id: int) -> bool:
        """Forget a partial message (e.g. the sender gave up); True if one was held."""
        if (src, msg_id) in self._partials:
            self._remove((src, msg_id))
            return True
        return False

    # -- internals -------------------------------------------------------------------------
    def _cap(self, trusted: bool) -> int:
        """The largest message one sender may have reassembled (bytes, bitmap included)."""
        if trusted:
            return self.max_bytes_per_sender
        return min(self.max_bytes_per_sender, self.max_bytes_untrusted)

    def _start(self, key: Key, frame: Frame, trusted: bool, now: float) -> _Partial | None:
        """Create state for a new message, rejecting ones that can never fit."""
        count = frame.count
        est = count * len(frame.payload) if frame.seq < count - 1 else 0
        cap = self._cap(trusted)
        if count > self.max_fragments or est + (count + 7) // 8 > cap:
            self.stats.rejected += 1
            if self.on_drop:
                self.on_drop(key, "too_large", count)
            return None
        src = key[0]
        while self.sender_usage(src)[0] >= self.max_messages_per_sender:
            own = next(k for k in self._partials if k[0] == src)
            self._drop(own, "evicted")
            self.stats.evictions += 1
        if not self._room(key, (count + 7) // 8, trusted, new=True):
            self.stats.busy += 1
            return None
        p = _Partial(src, count, frame.dst, trusted, now)
        self._partials[key] = p
        self._charge(src, 1, p.nbytes, trusted)
        return p

    def _allocate(self, key: Key, p: _Partial, flen: int) -> bool:
        """Reserve and allocate the message buffer once the fragment length is known."""
        need = p.count * flen
        if flen == 0 or need + len(p.bitmap) > self._cap(p.trusted):
            self._drop(key, "too_large")
            self.stats.rejected += 1
            return False
        if not self._room(key, need, p.trusted, new=False):
            self._drop(key, "busy")
            self.stats.busy += 1
            return False
        p.flen = flen
        # Large buffers are anonymous mappings: pages cost memory only once written, and the
        # whole buffer goes back to the system when the message completes or is dropped.
        p.buf = mmap.mmap(-1, need) if need >= MMAP_THRESHOLD else bytearray(need)
        if p.last is not None:
            off = (p.count - 1) * flen
            p.buf[off : off + len(p.last)] = p.last
            p.total = off + len(p.last)
            p.last = None
        p.nbytes += need
        self._charge(key[0], 0, need, p.trusted)
        return True

    def _room(self, key: Key, size: int, trusted: bool, new: bool) -> bool:
        """Evict until ``size`` more bytes (and one more message if ``new``) fit; False if not.

        The sender's own partial messages go first (its quota), then other senders' oldest
        untrusted ones; a trusted sender may also evict other trusted ones as a last resort. An
        untrusted message also fits within ``max_bytes_untrusted`` of all untrusted ones.
        """
        src = key[0]
        while self.sender_usage(src)[1] + size > self.max_bytes_per_sender:
            own = next((k for k in self._partials if k[0] == src and k != key), None)
            if own is None:
                return False
            self._drop(own, "evicted")
            self.stats.evictions += 1
        while not trusted and self._untrusted_bytes + size > self.max_bytes_untrusted:
            victim = next(
                (k for k, q in self._partials.items() if k != key and not q.trusted), None
            )
            if victim is None:
                return False
            self._drop(victim, "evicted")
            self.stats.evictions += 1
        while self._bytes + size > self.max_bytes or (
            new and len(self._partials) >= self.max_messages
        ):
            victim = next(
                (k for k, q in self._partials.items() if k != key and not q.trusted), None
            )
            if victim is None and trusted:
                victim = next((k for k in self._partials if k != key), None)
            if victim is None:
                return False
            self._drop(victim, "evicted")
            self.stats.evictions += 1
        return True

    def _charge(self, src: int, messages: int, nbytes: int, trusted: bool) -> None:
        use = self._by_sender.setdefault(src, [0, 0])
        use[0] += messages
        use[1] += nbytes
        self._bytes += nbytes
        if not trusted:
            self._untrusted_bytes += nbytes
        if use[0] <= 0:
            del self._by_sender[src]

    def _remove(self, key: Key) -> None:
        p = self._partials.pop(key)
        self._charge(key[0], -1, -p.nbytes, p.trusted)
        if isinstance(p.buf, mmap.mmap):
            p.buf.close()
        p.buf = None  # release the buffer now, even if someone still holds the _Partial

    def _drop(self, key: Key, reason: str) -> None:
        logger.debug("dropping partial message %s: %s", key, reason)
        count = self._partials[key].count
        self._remove(key)
        if self.on_drop:
            self.on_drop(key, reason, count)

    def _complete(
        self, key: Key, dst: int, payload: bytes, trusted: bool, now: float
    ) -> CompletedMessage:
        if self.completed_memory > 0:
            done = self._done[1 if trusted else 0]
            done[key] = now
            done.move_to_end(key)
            while len(done) > self.completed_memory:
                done.popitem(last=False)
        self.stats.completed += 1
        return CompletedMessage(key[0], dst, key[1], payload)
