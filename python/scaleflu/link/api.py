"""The Link interface the apps use, and ArqLink: that interface over any frame transport.

``Link`` is what the FL apps talk to: ``send(peer, message, timeout)`` blocks until the message
is delivered bit-exact (DELIVERED), certainly not delivered (FAILED) or ended without a
confirmation (UNCONFIRMED: send the same bytes again, the receiver recognises the retry and does
not deliver it twice), ``recv(timeout)`` returns the next (src, bytes).
``set_peer_key(peer, key)`` authenticates every frame exchanged with ``peer`` (HMAC-SHA256 link
tags, see ``scaleflu.link.arq``): forged ACKs, NACKs and DATA frames are dropped. ``ArqLink``
implements it over any frame transport: give it a ``transmit(bytes)`` callable and call
``feed(raw)`` for each frame received; the GNU Radio back-ends in ``scaleflu.radio`` do exactly
that with PDUs, and ``scaleflu.link.memory`` with an in-process channel.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .arq import ArqConfig, ArqEndpoint, SendHandle, SendStatus
from .wire import Message, decode_message, encode_message

logger = logging.getLogger(__name__)


class LinkClosedError(RuntimeError):
    """The link was closed."""


@dataclass(frozen=True)
class DeliveryResult:
    """Outcome of a blocking send."""

    status: SendStatus
    reason: str
    peer: int
    msg_id: int
    size: int
    frames_sent: int
    retransmissions: int
    elapsed: float | None

    @property
    def ok(self) -> bool:
        """True when the receiver confirmed the message (DELIVERED)."""
        return self.status is SendStatus.DELIVERED

    @property
    def unconfirmed(self) -> bool:
        """True when the outcome is unknown (the receiver may hold the message)."""
        return self.status is SendStatus.UNCONFIRMED

    @classmethod
    def from_handle(cls, h: SendHandle) -> DeliveryResult:
        """Snapshot a finished (or abandoned) SendHandle."""
        return cls(
            h.status, h.reason, h.dst, h.msg_id, h.size, h.frames_sent, h.retransmissions, h.elapsed
        )


def message_bytes(message: bytes | bytearray | memoryview | Message, src: int, dst: int) -> bytes:
    """Bytes to send: raw bytes as they are, a Message wire-encoded with sender/receiver set."""
    if isinstance(message, Message):
        return encode_message(dataclasses.replace(message, sender=src, receiver=dst))
    return bytes(message)


class Link(abc.ABC):
    """A reliable message link between numbered nodes (what the FL apps program against)."""

    node_id: int

    @abc.abstractmethod
    def send_async(
        self, peer: int, message: bytes | Message, timeout: float | None = None
    ) -> SendHandle:
        """Start sending; the handle reports DELIVERED, FAILED or UNCONFIRMED (by ``timeout``)."""

    def send(
        self, peer: int, message: bytes | Message, timeout: float | None = None
    ) -> DeliveryResult:
        """Send and block until the message is delivered or the send failed."""
        handle = self.send_async(peer, message, timeout)
        if not handle.wait(self._wait_limit(timeout)):
            self.cancel(handle, "no result from the link")
        return DeliveryResult.from_handle(handle)

    def _wait_limit(self, timeout: float | None) -> float | None:
        """How long a blocking send waits for its handle (None = forever)."""
        return None if timeout is None else timeout + 5.0

    def set_peer_key(self, peer: int, key: bytes | None) -> None:
        """Authenticate the link with ``peer`` with a shared key (None: stop); both ends must.

        Link kinds without link-level authentication raise NotImplementedError.
        """
        raise NotImplementedError(f"{type(self).__name__} has no link-level authentication")

    def set_require_auth(self, on: bool) -> None:
        """Drop every frame from peers without a link key (``ArqConfig.require_auth``).

        Link kinds without link-level authentication raise NotImplementedError.
        """
        raise NotImplementedError(f"{type(self).__name__} has no link-level authentication")

    def receiving_from(self, peer: int) -> bool:
        """Whether part of a message from ``peer`` is held now (a transfer from it is arriving).

        Lets the layer above wait for an upload under way instead of giving up on a timer that
        does not know the link's speed. False where the link kind cannot tell.
        """
        return False

    @abc.abstractmethod
    def cancel(self, handle: SendHandle, reason: str = "cancelled") -> None:
        """End a pending send now (FAILED, or UNCONFIRMED if all of it was sent; ``reason``)."""

    @abc.abstractmethod
    def recv(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """Next delivered (src, payload), or None after ``timeout`` seconds (None = forever)."""

    def recv_message(
        self, timeout: float | None = None, reference: dict[str, Any] | None = None
    ) -> tuple[int, Message] | None:
        """Next delivered message decoded from the wire format (WireError if it is not one)."""
        got = self.recv(timeout)
        if got is None:
            return None
        return got[0], decode_message(got[1], reference=reference)

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the link; pending sends fail with reason 'closed'."""

    def __enter__(self) -> Link:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ArqLink(Link):
    """Link over any frame transport: an ArqEndpoint driven by one timer thread under a lock.

    ``transmit`` is called with the link's lock held and must not block for long nor call back
    into the link (queue the frame, post a PDU). Call ``feed(raw)`` from any thread for each
    frame received from the transport.
    """

    def __init__(
        self,
        node_id: int,
        transmit: Callable[[bytes], None],
        config: ArqConfig | None = None,
        name: str | None = None,
        **overrides: Any,
    ) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inbox: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self._closed = False
        self._wait_until = 0.0  # when the timer thread wakes up next on its own (clock units)
        self._clock: Callable[[], float] = time.monotonic
        self._timer_waits: dict[str, float] = {}  # other timer threads (the MAC's): wake-up times
        self.endpoint = ArqEndpoint(
            node_id,
            transmit,
            clock=time.monotonic,
            config=config,
            on_message=lambda src, payload: self._inbox.put((src, payload)),
            **overrides,
        )
        self.node_id = node_id
        self._thread = threading.Thread(
            target=self._run, name=name or f"arq-link-{node_id}", daemon=True
        )
        self._thread.start()

    def feed(self, raw: bytes, snr_db: float | None = None) -> None:
        """Hand one frame received from the transport to the endpoint (thread-safe);
        ``snr_db``: the SNR the PHY measured on it (link adaptation), when it measures one."""
        with self._wake:
            if self._closed:
                return
            self.endpoint.on_frame(raw, snr_db)
            # wake the timer thread only when a timer now falls due before it would wake
            # anyway: a wake-up per received frame cost a thread switch and the GIL per frame
            nd = self.endpoint.next_deadline()
            if nd is not None and nd < self._wait_until:
                self._wake.notify()

    def set_clock(self, clock: Callable[[], float]) -> None:
        """Run every timer of this link (ARQ, reassembly, a MAC put under it) on ``clock``.

        For a medium with its own time (the sample-level shared medium's virtual time): call it
        before the first send, and have the clock's owner call :meth:`clock_advanced` whenever
        the clock moved, so timers fire on time even when the clock runs faster than the wall.
        Deadlines (``send(timeout=...)``) and ``elapsed`` are then in seconds of ``clock``.
        """
        with self._wake:
            self._clock = clock
            self.endpoint.clock = clock
            self.endpoint.reassembler.clock = clock
            self.endpoint._tokens_at = clock()
            self._wait_until = 0.0
            self._wake.notify_all()

    @property
    def clock(self) -> Callable[[], float]:
        """The clock of this link's timers (time.monotonic unless set_clock was called)."""
        return self._clock

    def clock_advanced(self) -> None:
        """The link's clock moved (called by its owner): wake the timer threads that are due."""
        now = self._clock()
        # a copy (one C call under the GIL): the timer threads add and remove their entries
        # while this runs on the clock owner's thread ("dictionary keys changed during
        # iteration" killed the shared medium's lockstep once it ran fast)
        waits = list(self._timer_waits.values())
        due = 0.0 < self._wait_until <= now or any(0.0 < t <= now for t in waits)
        if due:
            with self._wake:
                self._wake.notify_all()

    def send_async(
        self, peer: int, message: bytes | Message, timeout: float | None = None
    ) -> SendHandle:
        """Start sending ``message`` to ``peer``; see Link.send_async."""
        data = message_bytes(message, self.node_id, peer)
        with self._wake:
            if self._closed:
                raise LinkClosedError("link is closed")
            handle = self.endpoint.send(peer, data, deadline=timeout)
            self._wake.notify()
        return handle

    def recv(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """Next delivered (src, payload) or None after ``timeout``."""
        if self._closed and self._inbox.empty():
            raise LinkClosedError("link is closed")
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def _wait_limit(self, timeout: float | None) -> float | None:
        """Blocking sends wait for the ARQ deadline plus a grace period, never forever."""
        return (self.endpoint.config.deadline if timeout is None else timeout) + 5.0

    def cancel(self, handle: SendHandle, reason: str = "cancelled") -> None:
        """End a pending send now."""
        with self._wake:
            self.endpoint.cancel(handle, reason)

    def set_peer_key(self, peer: int, key: bytes | None) -> None:
        """Authenticate every frame exchanged with ``peer`` (see ArqEndpoint.set_peer_key)."""
        with self._wake:
            self.endpoint.set_peer_key(peer, key)

    def set_require_auth(self, on: bool) -> None:
        """Drop frames from peers without a key (see ArqEndpoint.set_require_auth)."""
        with self._wake:
            self.endpoint.set_require_auth(on)

    def receiving_from(self, peer: int) -> bool:
        """Whether the reassembler holds a partial message from ``peer`` (see Link)."""
        with self._lock:
            return self.endpoint.reassembler.sender_usage(peer)[0] > 0

    def stats(self) -> dict[str, Any]:
        """Snapshot of the ARQ and reassembly counters."""
        with self._lock:
            return {
                "arq": self.endpoint.stats.as_dict(),
                "reassembly": self.endpoint.reassembler.stats.as_dict(),
            }

    def close(self) -> None:
        """Stop the timer thread and fail pending sends."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self.endpoint.cancel_all("closed")
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        with self._wake:
            while not self._closed:
                try:
                    self.endpoint.poll()
                    deadline = self.endpoint.next_deadline()
                except Exception:  # keep the link alive; the error is a bug worth a traceback
                    logger.exception("ARQ poll failed")
                    deadline = None
                now = self._clock()
                wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                if wait > 0:
                    self._wait_until = now + wait
                    self._wake.wait(wait)
                self._wait_until = 0.0  # awake: feed() need not notify
