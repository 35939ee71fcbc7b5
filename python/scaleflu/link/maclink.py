"""MacLink: an ArqLink whose frames go through the server-scheduled MAC (real time, threaded).

The node with ``server_id`` runs a :class:`~scaleflu.link.mac.MacServer`, every other node a
:class:`~scaleflu.link.mac.MacStation` (joins by contention unless it is listed in the server's
``members``). The apps use it as any Link: ``send``/``recv``; the server may also
``broadcast(payload, targets, timeout)`` one message to several robots (they receive it from
``recv`` like any other message). Give it the transport's ``transmit`` and call ``feed(raw)``
for every frame received.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from .api import ArqLink, LinkClosedError, message_bytes
from .arq import ArqConfig
from .frame import BROADCAST
from .mac import BroadcastHandle, MacConfig, MacServer, MacStation
from .wire import Message

logger = logging.getLogger(__name__)


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

    def feed(self, raw: bytes) -> None:
        """One frame from the transport (thread-safe)."""
        with self._wake:
            if self._closed:
                return
            (self.mac or self.endpoint).on_frame(raw)
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
                now = time.monotonic()
                wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                if wait > 0:
                    self._wake.wait(wait)
