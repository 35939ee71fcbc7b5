"""MacLink: an ArqLink whose frames go through the server-scheduled MAC (real time, threaded).

The node with ``server_id`` runs a :class:`~scaleflu.link.mac.MacServer`, every other node a
:class:`~scaleflu.link.mac.MacStation` (joins by contention unless it is listed in the server's
``members``). The apps use it as any Link: ``send``/``recv``; the server may also
``broadcast(payload, targets, timeout)`` one message to several robots (they receive it from
``recv`` like any other message). Give it the transport's ``transmit`` and call ``feed(raw)``
for every frame received. ``attach_mac`` runs the same MAC under an ArqLink that a back-end
built (the OFDM links of ``scaleflu.radio.links`` do it in their constructors, given a
:class:`MacSetup`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .api import ArqLink, LinkClosedError, message_bytes
from .arq import ArqConfig
from .frame import BROADCAST
from .mac import BroadcastHandle, MacConfig, MacServer, MacStation
from .wire import Message

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MacSetup:
    """The MAC a link is built with: its settings and this node's place in the schedule."""

    config: MacConfig
    server_id: int = 0  # the node that schedules the medium
    members: tuple[int, ...] = ()  # server: robots admitted from the start; robot: itself if so
    seed: int | None = None  # the MAC's random choices (contention slots, grant numbers)


class MacLink(ArqLink):
    """ArqLink + MAC (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        transmit: Callable[[bytes], None],
        config: ArqConfig | None = None,
        mac: MacConfig | None = None,
        server_id: int = 0,
        members: Iterable[int] = (),
        seed: int | None = None,
        **overrides: Any,
    ) -> None:
        self.mac: MacServer | MacStation | None = None
        super().__init__(node_id, transmit, config=config, **overrides)
        with self._wake:
            if node_id == server_id:
                self.mac = MacServer(self.endpoint, transmit, mac, members=members, seed=seed)
            else:
                self.mac = MacStation(
                    self.endpoint,
                    transmit,
                    mac,
                    server_id=server_id,
                    joined=node_id in set(members),
                    seed=seed,
                )
            self._wake.notify()

    @property
    def is_server(self) -> bool:
        """Whether this node schedules the medium."""
        return isinstance(self.mac, MacServer)

    def feed(self, raw: bytes, snr_db: float | None = None) -> None:
        """One frame from the transport (thread-safe); ``snr_db``: the PHY's SNR of it."""
        with self._wake:
            if self._closed:
                return
            (self.mac or self.endpoint).on_frame(raw, snr_db)
            self._wake.notify()

    def broadcast(
        self,
        message: bytes | Message,
        targets: Iterable[int],
        timeout: float | None = None,
    ) -> BroadcastHandle:
        """Server: put ``message`` on air once for every target; repair what they miss."""
        if not isinstance(self.mac, MacServer):
            raise RuntimeError("only the server broadcasts")
        data = message_bytes(message, self.node_id, BROADCAST)
        with self._wake:
            if self._closed:
                raise LinkClosedError("link is closed")
            deadline = self.endpoint.config.deadline if timeout is None else timeout
            h = self.mac.broadcast(data, targets, deadline=deadline)
            self._wake.notify()
        return h

    def members(self) -> list[int]:
        """Server: robots admitted to the MAC."""
        if not isinstance(self.mac, MacServer):
            return []
        with self._lock:
            return sorted(self.mac.members)

    def stats(self) -> dict[str, Any]:
        """ARQ, reassembly and MAC counters."""
        out = super().stats()
        with self._lock:
            if self.mac is not None:
                out["mac"] = self.mac.stats.as_dict()
        return out

    def _run(self) -> None:
        with self._wake:
            while not self._closed:
                target = self.mac or self.endpoint
                try:
                    target.poll()
                    deadline = target.next_deadline()
                except Exception:  # keep the link alive; the error is a bug worth a traceback
                    logger.exception("MAC/ARQ poll failed")
                    deadline = None
                now = self._clock()
                wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                if wait > 0:
                    self._wake.wait(wait)


def attach_mac(
    link: ArqLink,
    mac: MacConfig | None = None,
    server_id: int = 0,
    members: Iterable[int] = (),
    seed: int | None = None,
    tick: float = 0.02,
) -> MacServer | MacStation:
    """Put the MAC under an existing ArqLink (a radio back-end such as ``ofdm-shared``).

    The link's endpoint transmits into the MAC's queue from now on, frames fed to the link go
    through the MAC, and a second thread runs the MAC's timers under the link's lock (waking at
    least every ``tick`` seconds, since the link's own thread does not know them). The link
    gains ``mac``, ``is_server``, ``broadcast`` (server) and MAC counters in ``stats()``.
    The MAC's timers run on the link's clock (``ArqLink.set_clock``: the shared medium's virtual
    time on ``ofdm-shared``); set it before attaching.
    """
    with link._wake:
        transmit = link.endpoint.transmit
        if link.node_id == server_id:
            m: MacServer | MacStation = MacServer(
                link.endpoint, transmit, mac, members=members, seed=seed
            )
        else:
            m = MacStation(
                link.endpoint,
                transmit,
                mac,
                server_id=server_id,
                joined=link.node_id in set(members),
                seed=seed,
            )
        link.mac = m  # type: ignore[attr-defined]
        link.is_server = isinstance(m, MacServer)  # type: ignore[attr-defined]

    def feed(raw: bytes, snr_db: float | None = None) -> None:
        with link._wake:
            if link._closed:
                return
            m.on_frame(raw, snr_db)
            link._wake.notify_all()

    def broadcast(message, targets, timeout=None):  # noqa: ANN001, ANN202
        return MacLink.broadcast(link, message, targets, timeout)  # type: ignore[arg-type]

    base_stats = link.stats

    def stats() -> dict[str, Any]:
        out = base_stats()
        with link._lock:
            out["mac"] = m.stats.as_dict()
        return out

    def run() -> None:
        with link._wake:
            while not link._closed:
                try:
                    m.poll()
                    deadline = m.next_deadline()
                except Exception:
                    logger.exception("MAC poll failed")
                    deadline = None
                now = link.clock()  # the link's clock: the medium's virtual time on ofdm-shared
                wait = tick if deadline is None else min(tick, max(0.0, deadline - now))
                if wait > 0:
                    # clock_advanced() wakes this thread when its clock outruns the wall
                    link._timer_waits[name] = now + wait
                    link._wake.wait(wait)
                link._timer_waits.pop(name, None)

    link.feed = feed  # type: ignore[method-assign]
    link.broadcast = broadcast  # type: ignore[attr-defined]
    link.stats = stats  # type: ignore[method-assign]
    name = f"mac-{link.node_id}"
    threading.Thread(target=run, name=name, daemon=True).start()
    return m
