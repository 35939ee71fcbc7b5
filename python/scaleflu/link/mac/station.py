"""MacStation: a robot's MAC, which transmits only inside the grants addressed to it.

After it decodes a GRANT addressed to it, a robot sends its queued link frames (ACKs of the
downlink first, then DATA) up to the grant's byte budget, then a REPORT (backlog left, the
frames it sent, the SNR it measured on the server's latest frame, and for every broadcast named
in the grant: complete, or the bitmap of fragments received). With link adaptation its DATA go
at the MCS the GRANT names, its ACKs and REPORT at the control MCS. No clock
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
from ..mcs import MCS_TABLE
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
        self._ctl_mcs = self.config.control_index
        self.dl_snr_db: float | None = None  # SNR of the server's latest frame (PHY-measured)
        self.grant_mcs: int | None = None  # MCS of the last grant
        self.bytes_by_mcs: dict[str, int] = {}  # frames this robot put on air, by MCS
        # loss detection for the ARQ: DATA fragments sent per message with the grant they went
        # in, and per message the grant count when the server's latest ACK of it arrived
        self._grants = 0
        self._sent: dict[int, list[tuple[int, int]]] = {}
        self._ack_at: dict[int, int] = {}
        endpoint.transmit = self._q.put

    def on_frame(self, raw: bytes, snr_db: float | None = None) -> None:
        """One frame off the air: the server's BEACON/GRANT here, link frames to the ARQ.

        ``snr_db``: the SNR the PHY measured on it; the next REPORT carries the latest one of
        the server's frames (link adaptation)."""
        raw = bytes(raw)
        if (
            snr_db is not None
            and len(raw) >= 8
            and int.from_bytes(raw[4:6], "big") == self.server_id
        ):
            self.dl_snr_db = float(snr_db)
        if not is_mac_frame(raw):
            key = _frame_key(raw)
            if key is not None and key[0] == FrameType.ACK and key[1] == self.server_id:
                self._ack_at[key[3]] = self._grants
            self.ep.on_frame(raw, snr_db)
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
        """Bytes waiting for a grant: in the MAC queue and the ARQ's not yet handed over.

        Fragments in flight (handed over, not yet acknowledged) do not count: the server polls
        a robot whose burst lost frames until it has them, and idle robots every idle_poll_s,
        so a robot whose window is full of frames that await their ACKs is not polled in vain
        (a poll storm that starved the other robots)."""
        return self._q.nbytes + self.ep.backlog_bytes()

    def _tx(self, raw: bytes, control: bool, mcs: int | None = None) -> None:
        if control:
            self.stats.control_bytes_tx += len(raw)
            if self._ctl_mcs is not None:
                mcs = self._ctl_mcs
        else:
            self.stats.link_frames_tx += 1
            self.stats.link_bytes_tx += len(raw)
        if mcs is None:
            self.phy_transmit(raw)
        else:
            name = MCS_TABLE[mcs].name
            self.bytes_by_mcs[name] = self.bytes_by_mcs.get(name, 0) + len(raw)
            self.phy_transmit(raw, mcs)  # type: ignore[call-arg]

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

    def _declare_losses(self, heard: int | None) -> None:
        """Before a new grant: a fragment sent in an earlier grant that the server's ACKs sent
        after that grant's REPORT (the server sends them when the burst ended) do not list was
        lost, and so was every fragment of the previous grant when the server heard none of
        its frames (``heard`` 0): the ARQ retransmits them now instead of after their RTO
        (which under the MAC is long: a tail lost in a fade cost seconds)."""
        prev = self._grants - 1  # the grant this one's ``heard`` speaks of
        for msg_id in list(self._sent):
            seen = self._ack_at.get(msg_id, -1)
            if heard == 0:
                seen = max(seen, prev)
            sent = self._sent[msg_id]
            lost = [seq for seq, k in sent if k <= seen]
            if lost:
                self.ep.declare_lost(self.server_id, msg_id, lost)
            rest = [(seq, k) for seq, k in sent if k > seen]
            if rest and self.ep.sending(self.server_id, msg_id):
                self._sent[msg_id] = rest
            else:
                del self._sent[msg_id]
                self._ack_at.pop(msg_id, None)
        if len(self._ack_at) > 256:  # ACKs of messages no longer sent
            self._ack_at = {m: k for m, k in self._ack_at.items() if m in self._sent}

    def _on_grant(self, f: MacFrame) -> None:
        g = _parse_grant(f.body)
        seq, budget, refs = g.seq, g.budget, g.bcasts
        if g.mcs is not None and self._ctl_mcs is None:
            raise MacFrameError("GRANT names an MCS, this robot's PHY has none")
        self.joined = True  # a grant is proof of membership
        self._join_at = None
        self._join_pending = False
        self.grant_mcs = g.mcs
        self._grants += 1
        self._declare_losses(g.heard)
        self.ep.poll()  # owed ACKs and due retransmissions join the queue first
        sent = 0
        for raw in self._q.pop_upto(budget):
            key = _frame_key(raw)
            data = key is not None and key[0] == FrameType.DATA
            self._tx(raw, control=not data, mcs=g.mcs)
            if data and key[2] == self.server_id:  # type: ignore[index]
                self._sent.setdefault(key[3], []).append((key[4], self._grants))  # type: ignore[index]
            sent += 1
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
                MacType.REPORT,
                self.node_id,
                self.server_id,
                _report_body(seq, self.backlog, items, sent=sent, snr_db=self.dl_snr_db),
            ),
            self.node_id,
            self.server_id,
        )
        self._tx(raw, control=True)
        self.stats.reports_tx += 1
