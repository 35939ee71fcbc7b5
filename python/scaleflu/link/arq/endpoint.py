"""ArqEndpoint: selective-repeat ARQ over link frames, transport-agnostic and free of threads.

An ArqEndpoint fragments outgoing messages into DATA frames, paces them (window of frames in
flight and an optional token bucket in bytes per second), retransmits fragments that the peer's
ACK bitmaps report missing (fast retransmit, by count and by time) or that time out, and ends a
send at its deadline. Incoming DATA frames are reassembled, acknowledged with compact bitmaps and
delivered exactly once; a memory of completed messages makes late retransmissions (and retries of
the same message) re-ACKed but not re-delivered. The frames it exchanges are specified in
:mod:`scaleflu.link.arq.frames`, what a send's outcome means in :mod:`scaleflu.link.arq.handle`.

**Timers** (RFC 6298 per peer): SRTT/RTTVAR from one Karn-filtered sample per ACK (the newest
fragment it newly acknowledges that was sent once), RTO = SRTT + max(4·RTTVAR, granularity) +
ack_delay, clamped to [min_rto, max_rto] and at least the time the measured delivery rate needs
to drain the bytes in flight to that peer (``rate_floor``). Each round of timeouts doubles the
peer's RTO (a round lasts one RTO: not per fragment, not per poll); any ACK that acknowledges
new data resets it and, while the message has fragments never sent, restarts the timers of its
fragments in flight (``rto_restart``, RFC 6298 5.3). At the end of a message retransmissions
go out in as many copies as the peer's measured loss rate needs (``tail_loss_target``).
A fragment sent before one that has been acknowledged is retransmitted at once when
``reorder_tolerance`` later frames were acknowledged or it was sent a quarter SRTT before the
newest acknowledged one (time-based loss detection, as TCP RACK). The receiver sends its
COMPLETE ACK when a message completes, repeats it ``complete_ack_repeats`` times (at
``complete_ack_interval``, doubling) and again whenever a retransmission of the message arrives
(restarting the repeats); the last ACK of a partial message is repeated ``ack_repeats`` times
when nothing new arrives.

The endpoint never blocks and never starts threads: the owner calls ``on_frame`` for every frame
off the air, and ``poll`` whenever ``next_deadline`` passes. ``transmit`` is called from inside
``send``/``on_frame``/``poll`` and must not re-enter the endpoint synchronously.

This module is longer than the others because ArqEndpoint is one state machine: its sender and
receiver halves share the peer table, the clock, the key table and the transmit path, and each
ACK or DATA frame moves both; split apart they would be two classes reaching into one state.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..fragment import Reassembler
from ..frame import (
    BROADCAST,
    FRAME_HEADER_SIZE,
    RESERVED_MSG_ID,
    Frame,
    FrameCrcError,
    FrameError,
    FrameType,
    decode_frame,
    encode_frame,
    max_payload,
)
from .config import ArqConfig
from .frames import (
    _NACK_REASONS,
    _SNR_FIELD,
    ACK_HEADER_SIZE,
    MIN_KEY_SIZE,
    NACK_PAYLOAD,
    NACK_RESET,
    NACK_TOO_LARGE,
    TAG_SIZE,
    AckInfo,
    _complete_ack,
    ack_from_bitmap,
    decode_ack,
    encode_ack,
    encode_tagged_frame,
    frame_tag,
)
from .handle import SendHandle, SendStatus

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0  # delivery-rate samples are kept this long (windowed maximum)


LOSS_GAIN = 1.0 / 32  # EWMA gain of the per-peer loss estimate (per fragment whose fate is known)


_MAX_SNR_PEERS = 4096  # peers whose last frame SNR an endpoint remembers for its ACKs


@dataclass
class ArqStats:
    """Counters of an ArqEndpoint."""

    data_tx: int = 0  # DATA frames transmitted (first copies and retransmissions)
    retransmissions: int = 0
    fast_retransmissions: int = 0  # retransmissions triggered by an ACK gap
    declared_lost: int = 0  # ... of them declared lost by a MAC (declare_lost)
    rto_expiries: int = 0
    acks_tx: int = 0
    complete_acks_repeated: int = 0  # unsolicited repeats of COMPLETE ACKs
    acks_repeated: int = 0  # unsolicited repeats of the last ACK of a partial message
    acks_rx: int = 0
    nacks_tx: int = 0
    nacks_rx: int = 0
    bad_acks: int = 0
    bad_nacks: int = 0  # malformed NACKs, unknown reason codes, count mismatch
    auth_failures: int = 0  # frames from a keyed peer without a valid tag
    unauthenticated: int = 0  # unicast frames from peers without a key (require_auth)
    crc_errors: int = 0
    bad_frames: int = 0
    not_for_us: int = 0
    mac_frames_dropped: int = 0  # DATA frames with the MAC's reserved msg_id (no MAC took them)
    stale_acks: int = 0  # ACKs / NACKs for messages no longer being sent
    delivered: int = 0  # messages handed to the application
    sends_delivered: int = 0
    sends_failed: int = 0
    sends_unconfirmed: int = 0
    retries_recognised: int = 0  # sends that reused the msg id of an unconfirmed send
    tail_copies: int = 0  # extra copies of retransmissions at the end of a message
    bytes_tx: int = 0

    def as_dict(self) -> dict[str, int]:
        """Counters as a plain dict."""
        return asdict(self)


class _Outgoing:
    """Sender state of one message."""

    def __init__(
        self, handle: SendHandle, frames: list[bytes], deadline: float, digest: bytes
    ) -> None:
        n = len(frames)
        self.handle = handle
        self.frames = frames
        self.deadline = deadline
        self.digest = digest
        self.acked = np.zeros(n, dtype=np.uint8)
        self.n_acked = 0
        self.n_sent = 0  # fragments transmitted at least once
        self.cum = 0  # every seq < cum is acknowledged
        self.pending: deque[int] = deque(range(n))
        self.queued = bytearray(b"\x01" * n)
        self.in_flight: dict[int, float] = {}  # seq -> RTO expiry
        self.order = [-1] * n  # transmission order of the latest copy
        self.tx_time = [0.0] * n
        self.copies = [0] * n
        self.max_acked_order = -1
        self.max_acked_tx = -1e300  # transmission time of the newest acknowledged copy
        self.timed_out: set[int] = set()  # fragments whose latest copy was lost by timeout
        # fragments whose next copy / whose latest copy is a timeout retransmission (the
        # time-based loss rule judges those: an ACK of an earlier copy proves nothing, Karn)
        self.rto_due: set[int] = set()
        self.rto_copy: set[int] = set()
        # fragments whose earlier copies an ACK proved lost: an ACK of the latest copy is then
        # unambiguous (only that copy can have got through)
        self.proven_lost: set[int] = set()


class _Peer:
    """Per-peer sender state: RTT estimator, backoff and delivery rate (RFC 6298)."""

    __slots__ = (
        "srtt",
        "rttvar",
        "min_rtt",
        "backoff",
        "backoff_at",
        "backoff_span",
        "rate",
        "rate_t0",
        "rate_acc",
        "rate_samples",
        "inflight_bytes",
        "loss",
    )

    def __init__(self) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rtt: float | None = None
        self.backoff = 0  # RTO doublings since the last fresh ACK
        # A round of timeouts is one RTO long: the RTO doubles again only when the RTO it had
        # at the last doubling (backoff_span) has passed since (backoff_at). Fragments sent a
        # few ms apart time out a few ms apart, and counting each poll as a round would take
        # the RTO to its cap within milliseconds at the end of every lossy transfer.
        self.backoff_at: float | None = None
        self.backoff_span = 0.0
        self.rate: float | None = None  # bytes/s acknowledged: max of the recent samples
        self.rate_t0: float | None = None
        self.rate_acc = 0
        self.rate_samples: deque[tuple[float, float]] = deque()
        self.inflight_bytes = 0
        # forward frame loss rate: EWMA over fragments whose fate an ACK proved (acknowledged
        # = 0, shown missing = 1); timeouts are left out (a stall is not a loss)
        self.loss = 0.0


class _AckState:
    """Receiver-side ACK scheduling of one partial message."""

    __slots__ = ("new", "due", "last_sent", "rep_due", "rep_left", "rep_gap")

    def __init__(self) -> None:
        self.new = 0
        self.due: float | None = None
        self.last_sent = -1e300
        self.rep_due: float | None = None  # unprompted repeat of the last ACK
        self.rep_left = 0
        self.rep_gap = 0.0


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
        if cfg.complete_ack_repeats < 0 or cfg.complete_ack_interval <= 0:
            raise ValueError("complete_ack_repeats must be >= 0, complete_ack_interval > 0")
        if cfg.ack_repeats < 0 or cfg.max_tail_copies < 1 or not 0.0 < cfg.tail_loss_target < 1.0:
            raise ValueError("ack_repeats >= 0, max_tail_copies >= 1, 0 < tail_loss_target < 1")
        if cfg.tail_fragments < 0 or cfg.reack_burst < 1:
            raise ValueError("tail_fragments must be >= 0, reack_burst >= 1")
        max_payload(cfg.mtu)  # validates the MTU
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
            max_messages_per_sender=cfg.reassembly_max_messages_per_sender,
            max_bytes_per_sender=cfg.reassembly_max_bytes_per_sender,
            max_bytes_untrusted=cfg.reassembly_max_bytes_untrusted,
        )
        self._inbox: deque[tuple[int, bytes]] = deque()
        self._out: OrderedDict[tuple[int, int], _Outgoing] = OrderedDict()
        self._acks: dict[tuple[int, int], _AckState] = {}
        # key -> (start of the current ack_delay window, COMPLETE ACKs sent in it)
        self._reacks: OrderedDict[tuple[int, int], tuple[float, int]] = OrderedDict()
        self._repeats: dict[tuple[int, int], list[float]] = {}  # key -> [due, left, gap, count]
        self._unconfirmed: OrderedDict[tuple[int, bytes], tuple[int, float]] = OrderedDict()
        self._keys: dict[int, bytes] = {}
        self._next_id = random.getrandbits(32) if msg_id_start is None else msg_id_start
        if self._next_id == RESERVED_MSG_ID:
            self._next_id = 0
        self._order = 0
        self._in_flight = 0
        self._peers: dict[int, _Peer] = {}
        self._tokens = float(cfg.burst_bytes)
        self._tokens_at = clock()
        self._ack_max = max_payload(cfg.mtu) - ACK_HEADER_SIZE - TAG_SIZE - _SNR_FIELD.size
        self._broadcast_keys: set[tuple[int, int]] = set()
        # per peer: the SNR (dB) the PHY measured on its latest frame, reported back in our
        # ACKs to it (ACK version 2); bounded, oldest peer out first
        self._rx_snr: OrderedDict[int, float] = OrderedDict()
        # called with (peer, snr_db or None, fragments newly acknowledged, fragments proven
        # lost) for every valid ACK of one of our sends: link adaptation hooks in here
        self.on_peer_report: Callable[[int, float | None, int, int], None] | None = None

    # -- public API ------------------------------------------------------------------------
    def set_peer_key(self, peer: int, key: bytes | None) -> None:
        """Authenticate every frame exchanged with ``peer`` with ``key`` (None: stop).

        The key (at least 16 bytes; 32 random bytes recommended, e.g. derived per robot and
        session with HKDF) must be set on both ends. Sends already in progress to ``peer`` use
        the framing they started with; set keys before sending.
        """
        if not 0 <= peer < BROADCAST or peer == self.node_id:
            raise ValueError(f"no link key for node {peer}")
        if key is None:
            self._keys.pop(peer, None)
            return
        if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_SIZE:
            raise ValueError(f"a link key must be at least {MIN_KEY_SIZE} bytes")
        self._keys[peer] = bytes(key)

    def has_peer_key(self, peer: int) -> bool:
        """Whether frames with ``peer`` are authenticated."""
        return peer in self._keys

    def set_require_auth(self, on: bool) -> None:
        """Drop every frame from peers without a link key (``ArqConfig.require_auth``)."""
        self.config = replace(self.config, require_auth=bool(on))

    def send(
        self,
        dst: int,
        payload: bytes,
        deadline: float | None = None,
        msg_id: int | None = None,
    ) -> SendHandle:
        """Queue a message for reliable delivery to ``dst``; ``deadline`` in seconds from now.

        Bytes identical to a recent UNCONFIRMED send to ``dst`` reuse its message id, so the
        receiver recognises the retry; ``msg_id`` forces an id (only ever reuse one for the same
        bytes to the same peer).
        """
        if not 0 <= dst < BROADCAST or dst == self.node_id:
            raise ValueError(f"cannot send reliably to node {dst}")
        if len(payload) > self.config.max_message_size:
            raise ValueError(f"message of {len(payload)} bytes exceeds max_message_size")
        now = self.clock()
        digest = hashlib.sha256(payload).digest()
        prior = self._unconfirmed.get((dst, digest))
        if prior is not None and now - prior[1] >= self.config.completed_ttl:
            prior = None  # the receiver has forgotten it: a retry would not be recognised
        if msg_id is not None:
            if not 0 <= msg_id < RESERVED_MSG_ID:
                raise ValueError(f"msg_id {msg_id} out of range (0..{RESERVED_MSG_ID - 1})")
            for (d, dig), (mid, _) in self._unconfirmed.items():
                if d == dst and mid == msg_id and dig != digest:
                    raise ValueError(f"msg_id {msg_id} was used for other bytes to node {dst}")
        elif prior is not None:
            msg_id = prior[0]
        if msg_id is not None and (dst, msg_id) in self._out:
            raise ValueError(f"msg_id {msg_id} to node {dst} is still being sent")
        retry = msg_id is not None
        if msg_id is None:
            msg_id = self._next_id
            self._next_id = (self._next_id + 1) % RESERVED_MSG_ID  # never the MAC's id
        else:
            self._unconfirmed.pop((dst, digest), None)
            self.stats.retries_recognised += prior is not None
        frames = self._fragment(payload, msg_id, dst)
        handle = SendHandle(msg_id, dst, len(payload), len(frames), now, retry=retry)
        limit = self.config.deadline if deadline is None else deadline
        self._out[(dst, msg_id)] = _Outgoing(handle, frames, now + limit, digest)
        logger.debug(
            "send %d bytes to %d as msg %d (%d frames%s)",
            len(payload),
            dst,
            msg_id,
            len(frames),
            ", retry" if retry else "",
        )
        self.poll()
        return handle

    def receive(self) -> tuple[int, bytes] | None:
        """Pop the oldest delivered (src, payload) when no on_message callback is set."""
        return self._inbox.popleft() if self._inbox else None

    def cancel(self, handle: SendHandle, reason: str = "cancelled") -> None:
        """End a pending send now (FAILED, or UNCONFIRMED if all of it was sent)."""
        o = self._out.get((handle.dst, handle.msg_id))
        if o is not None:
            self._end(o, reason, self.clock())

    def cancel_all(self, reason: str = "cancelled") -> None:
        """End every pending send now (e.g. when the link closes)."""
        now = self.clock()
        for o in list(self._out.values()):
            self._end(o, reason, now)

    @property
    def pending_sends(self) -> int:
        """Number of sends not yet finished."""
        return len(self._out)

    def flush_acks(self, src: int) -> int:
        """Send now the ACKs owed to ``src`` (those a delay or a count still holds back); a MAC
        calls it when ``src``'s granted burst has ended, so that the ACK covers the whole burst.
        Returns how many went out."""
        now = self.clock()
        n = 0
        for key, st in list(self._acks.items()):
            if key[0] == src and (st.new > 0 or st.due is not None):
                self._send_ack(key, now)
                n += 1
        return n

    def backlog_bytes(self) -> int:
        """Bytes of fragments waiting to be transmitted (not in flight, not acknowledged)."""
        return sum(
            len(o.frames[seq]) for o in self._out.values() for seq in o.pending if not o.acked[seq]
        )

    def sending(self, dst: int, msg_id: int) -> bool:
        """Whether message ``msg_id`` to ``dst`` is still being sent."""
        return (dst, msg_id) in self._out

    def declare_lost(self, dst: int, msg_id: int, seqs: Iterable[int]) -> int:
        """Fragments ``seqs`` of message ``msg_id`` to ``dst`` are lost (a MAC knows: the peer's
        ACKs sent after it received the burst they went in do not list them): retransmit them
        at once, as a fast retransmission, instead of waiting for their RTO. Fragments already
        acknowledged or not in flight are left alone. Returns how many were declared lost."""
        o = self._out.get((dst, msg_id))
        if o is None:
            return 0
        p = self._peer(dst)
        n = 0
        for seq in seqs:
            if 0 <= seq < len(o.frames) and seq in o.in_flight and not o.acked[seq]:
                self._leave_flight(o, seq)
                self.stats.fast_retransmissions += 1
                self.stats.declared_lost += 1
                p.loss += LOSS_GAIN * (1.0 - p.loss)
                o.proven_lost.add(seq)
                self._requeue(o, seq, front=True)
                n += 1
        if n:
            self._pump(self.clock())
        return n

    def rx_snr(self, peer: int) -> float | None:
        """The SNR (dB) the PHY measured on ``peer``'s latest frame, None when unknown."""
        return self._rx_snr.get(peer)

    def on_frame(self, raw: bytes, snr_db: float | None = None) -> None:
        """Process one raw frame off the air (DATA, ACK or NACK); bad frames are counted.

        ``snr_db``: the SNR the PHY measured on this frame (the coded OFDM receiver's); the
        ACKs to its sender report it (ACK version 2)."""
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
        trusted = False
        key = self._keys.get(frame.src)
        if key is None:
            # a keyless sender: with require_auth nothing of it is answered or held, its
            # broadcasts included (broadcasts carry no tag; only a keyed peer's id is taken)
            if self.config.require_auth:
                self.stats.unauthenticated += 1
                return
        elif frame.dst != BROADCAST:
            frame = self._verify(frame, raw, key)
            if frame is None:
                return
            trusted = True
        now = self.clock()
        if snr_db is not None and math.isfinite(snr_db):
            self._rx_snr[frame.src] = float(snr_db)
            self._rx_snr.move_to_end(frame.src)
            while len(self._rx_snr) > _MAX_SNR_PEERS:
                self._rx_snr.popitem(last=False)
        if frame.type == FrameType.DATA:
            if frame.msg_id == RESERVED_MSG_ID:
                # a MAC control frame that no MAC intercepted (e.g. a BEACON that reached a
                # robot before its MAC was attached): never reassembled, delivered or ACKed
                self.stats.mac_frames_dropped += 1
                return
            self._on_data(frame, now, trusted)
        elif frame.type == FrameType.ACK:
            self._on_ack(frame, now)
        else:
            self._on_nack(frame, now)
        self._pump(now)

    def poll(self) -> None:
        """Run timers: deadlines, retransmission timeouts, delayed ACKs, pacing, reassembly."""
        now = self.clock()
        self.reassembler.expire(now)
        backed_off: set[int] = set()
        for o in list(self._out.values()):
            if now >= o.deadline:
                self._end(o, "deadline", now)
                continue
            expired = [seq for seq, expiry in o.in_flight.items() if now >= expiry]
            if not expired:
                continue
            # Many fragments timing out in the same instant is a stall (a busy CPU, a deep
            # queue), not that many losses: retransmit the oldest few and restart the others'
            # timers; if those were lost too, the ACK of the probes exposes them (RACK).
            expired.sort(key=o.order.__getitem__)
            if len(expired) > self.config.rto_probe:
                rto = self._rto(o.handle.dst) * self.config.backoff
                for seq in expired[self.config.rto_probe :]:
                    o.in_flight[seq] = now + rto
                expired = expired[: self.config.rto_probe]
            # a few lone fragments timing out at the end of a message are repeated (tail losses)
            tail = len(expired) <= self.config.tail_fragments and not o.pending
            for seq in expired:
                self._leave_flight(o, seq)
                o.proven_lost.discard(seq)  # timed out: its earlier copies may have arrived
                self.stats.rto_expiries += 1
                backed_off.add(o.handle.dst)
                limit = self.config.max_retransmissions
                if limit is not None and o.copies[seq] > limit:
                    self._end(o, "max_retransmissions", now)
                    break
                if tail:
                    o.timed_out.add(seq)
                o.rto_due.add(seq)
                self._requeue(o, seq, front=True)
        for dst in backed_off:  # one doubling per round (one RTO) of timeouts
            p = self._peer(dst)
            rto = self._rto(dst)
            if p.backoff_at is not None and now - p.backoff_at < p.backoff_span:
                continue  # still the round of the last doubling
            if p.backoff < self.config.max_backoff and rto < self.config.max_rto:
                p.backoff += 1
                p.backoff_at, p.backoff_span = now, rto
        for key, st in list(self._acks.items()):
            if st.due is not None and now >= st.due:
                self._send_ack(key, now)
            elif st.rep_due is not None and now >= st.rep_due:
                left, gap = st.rep_left - 1, st.rep_gap * 2
                self._send_ack(key, now)  # re-arms the repeats: keep counting down instead
                self.stats.acks_repeated += 1
                st.rep_left, st.rep_gap = left, gap
                st.rep_due = now + gap if left > 0 else None
        for key, rep in list(self._repeats.items()):
            if now >= rep[0]:
                self._tx_control(
                    FrameType.ACK,
                    key[0],
                    key[1],
                    _complete_ack(int(rep[3]), self._rx_snr.get(key[0])),
                )
                self.stats.acks_tx += 1
                self.stats.complete_acks_repeated += 1
                rep[1] -= 1
                rep[2] *= 2
                rep[0] = now + rep[2]
                if rep[1] <= 0:
                    del self._repeats[key]
        self._pump(now)

    def next_deadline(self) -> float | None:
        """Earliest clock time at which ``poll`` has work to do, or None when idle."""
        times: list[float] = []
        rd = self.reassembler.next_deadline()
        if rd is not None:
            times.append(rd)
        times.extend(st.due for st in self._acks.values() if st.due is not None)
        times.extend(st.rep_due for st in self._acks.values() if st.rep_due is not None)
        times.extend(rep[0] for rep in self._repeats.values())
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
        return (
            not self._out
            and not self._repeats
            and not any(st.due is not None for st in self._acks.values())
        )

    def rto(self, dst: int) -> float:
        """Current retransmission timeout towards ``dst`` (backoff and drain floor included)."""
        return self._rto(dst)

    # -- framing and authentication --------------------------------------------------------
    def _fragment(self, payload: bytes, msg_id: int, dst: int) -> list[bytes]:
        mtu = self.config.mtu
        key = self._keys.get(dst)
        mp = max_payload(mtu) - (TAG_SIZE if key is not None else 0)
        count = max(1, -(-len(payload) // mp))
        if count > 0xFFFFFFFF:
            raise ValueError("message needs more than 2**32-1 fragments")
        view = memoryview(payload)
        data = FrameType.DATA
        src = self.node_id
        if key is None:
            return [
                encode_frame(data, src, dst, msg_id, i, count, view[i * mp : (i + 1) * mp], mtu)
                for i in range(count)
            ]
        return [
            encode_tagged_frame(
                key, data, src, dst, msg_id, i, count, view[i * mp : (i + 1) * mp], mtu
            )
            for i in range(count)
        ]

    def _verify(self, frame: Frame, raw: bytes, key: bytes) -> Frame | None:
        """The frame with its tag stripped, or None (counted) when the tag is missing or bad."""
        n = len(frame.payload)
        end = FRAME_HEADER_SIZE + n
        if n < TAG_SIZE or not hmac.compare_digest(
            frame_tag(key, raw[: end - TAG_SIZE]), raw[end - TAG_SIZE : end]
        ):
            self.stats.auth_failures += 1
            logger.debug("frame from node %d failed authentication", frame.src)
            return None
        return replace(frame, payload=frame.payload[: n - TAG_SIZE])

    def _tx_control(self, ftype: FrameType, dst: int, msg_id: int, payload: bytes) -> None:
        key = self._keys.get(dst)
        mtu = self.config.mtu
        if key is None:
            raw = encode_frame(ftype, self.node_id, dst, msg_id, 0, 1, payload, mtu)
        else:
            raw = encode_tagged_frame(key, ftype, self.node_id, dst, msg_id, 0, 1, payload, mtu)
        self.stats.bytes_tx += len(raw)
        self.transmit(raw)

    # -- receiver side ---------------------------------------------------------------------
    def _on_data(self, frame: Frame, now: float, trusted: bool) -> None:
        key = (frame.src, frame.msg_id)
        ra = self.reassembler
        was_done = ra.is_completed(*key)
        dups = ra.stats.duplicates
        if frame.dst == BROADCAST:
            self._broadcast_keys.add(key)
        done = ra.push(frame, trusted)
        if frame.dst == BROADCAST:  # unacknowledged broadcast: deliver, never ACK
            if done is not None or ra.progress(*key) is None:
                self._broadcast_keys.discard(key)
            if done is not None:
                self._deliver(done.src, done.payload)
            return
        if done is not None:
            self._acks.pop(key, None)
            self._deliver(done.src, done.payload)
            self._send_complete_ack(key, frame.count, now, repeat=True)
            return
        if was_done:  # a retransmission or a retry of a delivered message: confirm, no delivery
            # The sender has not heard any COMPLETE ACK yet: confirm at once and start the
            # unprompted repeats again (unless they are still running), so the confirmation
            # keeps coming until the sender stops sending, not only when a copy gets through.
            # Up to reack_burst answers per ack_delay: the sender's tail copies of one
            # retransmission arrive back to back, and answering each gives as many chances
            # (one answer per burst: five COMPLETE ACKs lost in a row held a LeNet transfer
            # at 40 % loss for 0.75 s more, link_bench --tails trace)
            start, n = self._reacks.get(key, (-1e300, 0))
            if now - start >= self.config.ack_delay or n < self.config.reack_burst:
                self._send_complete_ack(key, frame.count, now, repeat=key not in self._repeats)
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
        info.snr_db = self._rx_snr.get(key[0])
        self._tx_control(FrameType.ACK, key[0], key[1], encode_ack(info))
        self.stats.acks_tx += 1
        if st is not None:
            st.new = 0
            st.due = None
            st.last_sent = now
            if self.config.ack_repeats > 0:
                st.rep_left = self.config.ack_repeats
                st.rep_gap = self.config.complete_ack_interval
                st.rep_due = now + st.rep_gap

    def _send_complete_ack(
        self, key: tuple[int, int], count: int, now: float, repeat: bool
    ) -> None:
        self._tx_control(
            FrameType.ACK, key[0], key[1], _complete_ack(count, self._rx_snr.get(key[0]))
        )
        self.stats.acks_tx += 1
        start, n = self._reacks.get(key, (-1e300, 0))
        self._reacks[key] = (now, 1) if now - start >= self.config.ack_delay else (start, n + 1)
        self._reacks.move_to_end(key)
        while len(self._reacks) > max(1, self.config.completed_memory):
            self._reacks.popitem(last=False)
        gap = self.config.complete_ack_interval
        if repeat and self.config.complete_ack_repeats > 0:
            self._repeats[key] = [now + gap, self.config.complete_ack_repeats, gap, count]
            while len(self._repeats) > max(1, self.config.completed_memory):
                del self._repeats[next(iter(self._repeats))]

    def _on_reassembly_drop(self, key: tuple[int, int], reason: str, count: int) -> None:
        self._acks.pop(key, None)
        if key in self._broadcast_keys:
            self._broadcast_keys.discard(key)
        elif reason != "busy":  # busy: stay silent, the sender's timers try again later
            code = NACK_TOO_LARGE if reason == "too_large" else NACK_RESET
            self._tx_control(FrameType.NACK, key[0], key[1], NACK_PAYLOAD.pack(code, count))
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
        before = o.n_acked
        newest: int | None = None  # the newest newly acknowledged fragment
        if info.complete:
            newly = np.nonzero(o.acked == 0)[0].tolist()
        else:
            newly = []
            if info.base > o.cum:
                newly = (np.nonzero(o.acked[o.cum : info.base] == 0)[0] + o.cum).tolist()
                o.cum = info.base
            end = info.covered()
            if end > info.base:
                bits = np.unpackbits(np.frombuffer(info.bitmap, dtype=np.uint8))[: end - info.base]
                got = np.nonzero(bits)[0] + info.base
                newly += got[o.acked[got] == 0].tolist()
        p = self._peer(o.handle.dst)
        if newly:
            p.loss *= (1.0 - LOSS_GAIN) ** len(newly)
        for seq in newly:  # the RTT sample comes from the newest fragment, if it was sent once
            self._mark_acked(o, seq)
            if newest is None or o.order[seq] > o.order[newest]:
                newest = seq
        if o.n_acked > before:
            p.backoff = 0  # a fresh ACK: the path works, forget the backoff
            p.backoff_at = None
            if self.config.rto_restart and o.in_flight and o.n_sent < len(o.frames):
                floor = now + self._rto(o.handle.dst)
                for seq, exp in o.in_flight.items():
                    if exp < floor:
                        o.in_flight[seq] = floor
            self._rate_sample(p, sum(len(o.frames[s]) for s in newly), now)
        if newest is not None and o.copies[newest] == 1:  # Karn: never from a retransmission
            first = p.srtt is None
            self._rtt_sample(p, now - o.tx_time[newest])
            if first:  # frames sent under initial_rto: re-arm them with the measured RTO
                rto = self._rto(o.handle.dst)
                for q in self._out.values():
                    if q.handle.dst == o.handle.dst:
                        for seq, exp in q.in_flight.items():
                            q.in_flight[seq] = min(exp, q.tx_time[seq] + rto)
        lost_before = self.stats.fast_retransmissions
        try:
            self._on_ack_gaps(o, p, info, now)
        finally:
            if self.on_peer_report is not None:
                lost = self.stats.fast_retransmissions - lost_before
                try:
                    self.on_peer_report(o.handle.dst, info.snr_db, len(newly), lost)
                except Exception:
                    logger.exception("on_peer_report callback failed")

    def _on_ack_gaps(self, o: _Outgoing, p: _Peer, info: AckInfo, now: float) -> None:
        """After an ACK: finish the send, or retransmit what the ACK proves lost."""
        n = len(o.frames)
        if info.complete or o.n_acked == n:
            self._finish(o, SendStatus.DELIVERED, "", now)
            return
        tol = self.config.reorder_tolerance
        wnd = 0.25 * p.srtt if p.srtt is not None else 0.0
        end = info.covered()
        if len(info.bitmap) < self._ack_max:  # not truncated: it reports every fragment held
            end = n
        rtt_old = None
        if self.config.rack_rtt and p.srtt is not None:
            rtt_old = (
                now
                - (p.srtt + max(4 * p.rttvar, self.config.rto_granularity))
                - (self.config.ack_delay)
            )
        tail = o.n_sent == n  # every fragment sent once: nothing new follows the last ones
        for seq in [s for s in o.in_flight if s < end]:
            order = o.order[seq]
            by_order = order + tol < o.max_acked_order or (
                order < o.max_acked_order and o.tx_time[seq] + wnd < o.max_acked_tx
            )
            # By time alone only where the order rule cannot see (the tail, or a timeout
            # retransmission), and never as proof: the ACK may be late (a receiver stalled
            # behind a queue of our frames sends ACKs that predate them), and taking an ACK
            # of the earlier copy as one of this copy then made every frame sent before it
            # look lost (a retransmission storm, docs/link.md).
            by_time = (
                rtt_old is not None and o.tx_time[seq] < rtt_old and (tail or seq in o.rto_copy)
            )
            if by_order or by_time:
                self._leave_flight(o, seq)
                self.stats.fast_retransmissions += 1
                p.loss += LOSS_GAIN * (1.0 - p.loss)
                if by_order:
                    o.proven_lost.add(seq)
                else:  # the copy judged may still arrive: an ACK of this seq stays ambiguous
                    o.proven_lost.discard(seq)
                self._requeue(o, seq, front=True)

    def _on_nack(self, frame: Frame, now: float) -> None:
        o = self._out.get((frame.src, frame.msg_id))
        if o is None:
            self.stats.stale_acks += 1
            return
        if len(frame.payload) != NACK_PAYLOAD.size:
            self.stats.bad_nacks += 1
            return
        code, count = NACK_PAYLOAD.unpack(frame.payload)
        if code not in _NACK_REASONS or count != len(o.frames):
            self.stats.bad_nacks += 1
            logger.debug("NACK from %d with code %d / count %d ignored", frame.src, code, count)
            return
        self.stats.nacks_rx += 1
        if code == NACK_RESET:
            logger.info("node %d reset msg %d: sending it again", frame.src, frame.msg_id)
            o.acked[:] = 0
            o.n_acked = 0
            o.cum = 0
            o.proven_lost.clear()
            for seq in range(len(o.frames)):
                self._requeue(o, seq, front=False)
            return
        self._finish(o, SendStatus.FAILED, f"rejected by receiver: {_NACK_REASONS[code]}", now)

    def _mark_acked(self, o: _Outgoing, seq: int) -> bool:
        """Mark a fragment acknowledged; True when it was not acknowledged before."""
        if o.acked[seq]:
            return False
        o.acked[seq] = 1
        o.n_acked += 1
        if seq in o.in_flight:
            self._leave_flight(o, seq)
        if o.copies[seq] > 1 and seq not in o.proven_lost:
            # a timeout retransmission: which copy got through is unknown (Karn); if it was an
            # earlier one, this says nothing about frames sent after the latest copy, and
            # taking it as "newest delivered" made every frame in flight look lost (a
            # self-sustaining retransmission storm under CPU load: 7 000 copies for 1 357
            # fragments). After a loss proven by an ACK, only the latest copy can be the one.
            return True
        if o.order[seq] > o.max_acked_order:
            o.max_acked_order = o.order[seq]
            o.max_acked_tx = o.tx_time[seq]
        return True

    def _peer(self, dst: int) -> _Peer:
        p = self._peers.get(dst)
        if p is None:
            p = self._peers[dst] = _Peer()
        return p

    def _rtt_sample(self, p: _Peer, sample: float) -> None:
        p.min_rtt = sample if p.min_rtt is None else min(p.min_rtt, sample)
        if p.srtt is None:
            p.srtt, p.rttvar = sample, sample / 2
        else:
            p.rttvar = 0.75 * p.rttvar + 0.25 * abs(p.srtt - sample)
            p.srtt = 0.875 * p.srtt + 0.125 * sample

    def _rate_sample(self, p: _Peer, nbytes: int, now: float) -> None:
        """Delivery rate: bytes acknowledged per second while data was in flight."""
        if p.rate_t0 is None:
            p.rate_t0, p.rate_acc = now, 0
            return
        p.rate_acc += nbytes
        dt = now - p.rate_t0
        if dt >= max(0.01, p.srtt or 0.0) and p.rate_acc > 0:
            # windowed maximum (as BBR's bottleneck bandwidth): losses and timeouts make
            # samples small, and a small rate must not lengthen the RTO that slowed it
            p.rate_samples.append((now, p.rate_acc / dt))
            while p.rate_samples and now - p.rate_samples[0][0] > RATE_WINDOW_S:
                p.rate_samples.popleft()
            p.rate = max(r for _, r in p.rate_samples)
            p.rate_t0, p.rate_acc = now, 0

    def _rto(self, dst: int) -> float:
        cfg = self.config
        p = self._peers.get(dst)
        if p is None or p.srtt is None:
            base = cfg.initial_rto
        else:
            base = p.srtt + max(4 * p.rttvar, cfg.rto_granularity) + cfg.ack_delay
        base = max(cfg.min_rto, base)
        if p is not None:
            if p.rate and cfg.rate_floor:  # what is queued ahead of a frame must drain first
                base = max(base, 1.5 * p.inflight_bytes / p.rate)
            base *= cfg.backoff**p.backoff
        return min(cfg.max_rto, base)

    def _leave_flight(self, o: _Outgoing, seq: int) -> None:
        del o.in_flight[seq]
        self._in_flight -= 1
        self._peer(o.handle.dst).inflight_bytes -= len(o.frames[seq])

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
        dst = o.handle.dst
        if o.copies[seq] == 0:
            o.n_sent += 1
            if o.n_sent == len(o.frames) and self.config.rto_restart:
                # the last first transmission: from now on timers run from each fragment's
                # own transmission again (restarts had pushed them; tail losses need them)
                rto = self._rto(dst)
                for s, exp in o.in_flight.items():
                    o.in_flight[s] = min(exp, o.tx_time[s] + rto)
        o.copies[seq] += 1
        if seq in o.rto_due:
            o.rto_due.discard(seq)
            o.rto_copy.add(seq)
        else:
            o.rto_copy.discard(seq)
        if o.copies[seq] > 1:
            self.stats.retransmissions += 1
            o.handle.retransmissions += 1
        o.order[seq] = self._order
        self._order += 1
        o.tx_time[seq] = now
        p = self._peer(dst)
        p.inflight_bytes += len(frame)
        o.in_flight[seq] = now + self._rto(dst)
        self._in_flight += 1
        o.handle.frames_sent += 1
        self.stats.data_tx += 1
        self.stats.bytes_tx += len(frame)
        self.transmit(frame)
        copies = 1
        if seq in o.timed_out:  # a timeout: repeat the copy, a lone copy is often lost again
            o.timed_out.discard(seq)
            copies = self.config.rto_copies
        if o.copies[seq] > 1 and o.n_sent == len(o.frames):
            copies = max(copies, self._tail_copies(o, p))
        for _ in range(copies - 1):
            self.stats.bytes_tx += len(frame)
            self.stats.tail_copies += 1
            self.transmit(frame)

    def _tail_copies(self, o: _Outgoing, p: _Peer) -> int:
        """Copies of a retransmission at the end of a message (see ArqConfig.tail_loss_target)."""
        cfg = self.config
        if len(o.frames) - o.n_acked > cfg.tail_fragments or cfg.max_tail_copies <= 1:
            return 1
        target = cfg.tail_loss_target
        if p.loss <= target or not 0.0 < target < 1.0:
            return 1
        k = math.ceil(math.log(target) / math.log(min(p.loss, 0.99)))
        return max(1, min(cfg.max_tail_copies, k))

    def _end(self, o: _Outgoing, reason: str, now: float) -> None:
        """End a send without confirmation: FAILED if part of it never left, else UNCONFIRMED."""
        maybe = o.handle.retry or o.n_sent == len(o.frames)
        self._finish(o, SendStatus.UNCONFIRMED if maybe else SendStatus.FAILED, reason, now)

    def _finish(self, o: _Outgoing, status: SendStatus, reason: str, now: float) -> None:
        key = (o.handle.dst, o.handle.msg_id)
        if self._out.pop(key, None) is None:
            return
        for seq in list(o.in_flight):
            self._leave_flight(o, seq)
        if not any(d == key[0] for d, _ in self._out):
            self._peer(key[0]).rate_t0 = None  # idle: the next rate sample starts afresh
        if status is SendStatus.DELIVERED:
            self.stats.sends_delivered += 1
        elif status is SendStatus.UNCONFIRMED:
            self.stats.sends_unconfirmed += 1
            self._unconfirmed[(key[0], o.digest)] = (key[1], now)
            self._unconfirmed.move_to_end((key[0], o.digest))
            while len(self._unconfirmed) > max(1, self.config.completed_memory):
                self._unconfirmed.popitem(last=False)
            logger.warning(
                "send of msg %d to node %d unconfirmed (%s): the receiver may hold it; "
                "sending the same bytes again reuses the message id",
                key[1],
                key[0],
                reason,
            )
        else:
            self.stats.sends_failed += 1
            logger.warning("send of msg %d to node %d failed: %s", key[1], key[0], reason)
        o.handle._finish(status, reason, now)
