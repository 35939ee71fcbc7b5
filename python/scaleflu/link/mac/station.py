"""MacStation: a robot's MAC, which transmits only inside the grants addressed to it.

After it decodes a GRANT addressed to it, a robot sends its queued link frames (ACKs of the
downlink first, then DATA) up to the grant's byte budget, then a REPORT (backlog left, and for
every broadcast named in the grant: complete, or the bitmap of fragments received). No clock
synchronisation: everything a robot sends is timed from the end of the grant it heard.
**Registration** is the one contention access: a robot that is not yet a member sends JOIN in a
random slot of the server's BEACON; a robot not listed in the next BEACON retries after a random
binary-exponential backoff.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from ..arq import ArqEndpoint
from ..frame import BROADCAST, FrameType
from .config import MacConfig, MacStats
from .frames import (
    _JOIN,
    BcastStatus,
    MacFrame,
    MacFrameError,
    MacType,
    _parse_beacon,
    _parse_grant,
    _report_body,
    encode_mac,
    is_mac_frame,
    mac_from_air,
    mac_on_air,
)
from .txqueue import _frame_key, _TxQueue, _under_mac

logger = logging.getLogger(__name__)


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
