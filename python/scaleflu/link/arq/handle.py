"""The outcome of one send: :class:`SendStatus` and the :class:`SendHandle` that tracks it.

``DELIVERED`` only when the receiver acknowledged every fragment (a COMPLETE ACK, or every
fragment's bit). ``FAILED`` only when the message certainly did not get through: refused by the
receiver (NACK), or ended (deadline, ``max_retransmissions``, cancel, close) before every
fragment was even transmitted once. A send ended after every fragment went out without a
confirmation is ``UNCONFIRMED``: the receiver may or may not hold it. Retry it with the same
bytes: a new send of bytes identical to a recent ``UNCONFIRMED`` send to the same peer reuses its
message id (or pass ``msg_id=`` explicitly), and the receiver, which remembers completed (src,
msg_id) for ``completed_ttl``, ACKs it COMPLETE without delivering it twice.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


class SendStatus(enum.Enum):
    """Outcome of a send."""

    PENDING = "pending"
    DELIVERED = "delivered"  # the receiver confirmed every fragment
    FAILED = "failed"  # certainly not delivered (refused, or ended before all was sent once)
    UNCONFIRMED = "unconfirmed"  # ended without confirmation after all was sent: unknown


@dataclass
class SendHandle:
    """Tracks one send: DELIVERED, FAILED or UNCONFIRMED (with a reason) once finished."""

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
    retry: bool = False  # this send reused the message id of an earlier unconfirmed one
    _event: threading.Event = field(default_factory=threading.Event, repr=False)
    _callbacks: list[Callable[[SendHandle], None]] = field(default_factory=list, repr=False)

    def done(self) -> bool:
        """Whether the send has finished (delivered, failed or unconfirmed)."""
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
