"""MacServer: the scheduler on the server, and the broadcast downlink it runs.

The server owns the medium. It alternates a downlink burst (its queued link frames: broadcasts,
unicast DATA, ACKs of the robots' uploads) with one GRANT to one robot. After a GRANT it stays
silent until the robot's REPORT ends the granted burst or the grant's window (turnaround + the
budget's airtime + guard) has passed: a robot that does not answer costs one window, then it is
polled with exponential backoff. Its BEACON opens the contention slots in which robots that are
not yet members JOIN; the next BEACON lists the robots admitted.

**Broadcast downlink**: :meth:`MacServer.broadcast` puts a message on air once, addressed to
BROADCAST (the ArqEndpoints of the robots reassemble and deliver it, they never ACK it). Robots
report what they miss in their REPORTs; once every unconfirmed target has been polled since the
last pass, the server broadcasts the union of the missing fragments once more (NORM, RFC 5740,
without FEC), until every target confirmed or the deadline passed. The handle records each
target's progress (fragments it reported, repair passes since it last gained one:
:meth:`BroadcastHandle.stalled`); the owner may hand a stalled target over to a unicast
(:meth:`BroadcastHandle.abandon`), and the broadcast then goes on for the others.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..arq import ArqEndpoint
from ..fragment import fragment
from ..frame import BROADCAST, FRAME_OVERHEAD, FrameType
from ..mcs import MCS_TABLE, McsPolicy, McsPolicyConfig, parse_mcs
from .config import MacConfig, MacStats
from .frames import (
    _JOIN,
    _REPORT,
    _REPORT_ITEM,
    MAC_MSG_ID,
    MAC_OVERHEAD,
    MAX_BCAST_PER_GRANT,
    BcastStatus,
    MacFrame,
    MacFrameError,
    MacType,
    _beacon_body,
    _grant_body,
    _parse_report,
    encode_mac,
    is_mac_frame,
    mac_from_air,
    mac_on_air,
)
from .txqueue import _frame_key, _TxQueue, _under_mac

logger = logging.getLogger(__name__)


def _bitmap_missing(bitmap: bytes | None, count: int) -> list[int]:
    if bitmap is None:
        return list(range(count))
    return BcastStatus(0, count, False, bitmap).missing()


class BroadcastHandle:
    """One broadcast message: which targets confirmed it, and when it finished."""

    def __init__(self, msg_id: int, count: int, size: int, targets: set[int], started: float):
        self.msg_id = msg_id
        self.count = count
        self.size = size
        self.targets = set(targets)
        self.confirmed: set[int] = set()
        self.started = started
        self.finished: float | None = None
        self.reason = ""
        self.passes = 0
        self.frames_sent = 0
        # per target progress (the MAC's clock): when the first pass was all on air, the most
        # fragments each target reported holding, when that last grew, and the repair passes
        # queued since then; targets handed over to a unicast (abandon) are no longer served
        self.pass_out: float | None = None
        self.received: dict[int, int] = {}
        self.last_progress: dict[int, float] = {}
        self.passes_since: dict[int, int] = {}
        self._pass_at_report: dict[int, int] = {}  # target -> passes queued at its last REPORT
        self.abandoned: set[int] = set()
        self._abandon_req: set[int] = set()
        self._lock = threading.Lock()
        self._event = threading.Event()

    def done(self) -> bool:
        """Finished: every target confirmed (or handed over), or the deadline passed."""
        return self.finished is not None

    @property
    def ok(self) -> bool:
        """Every target confirmed the message, except those handed over (:meth:`abandon`)."""
        return self.confirmed >= self.targets - self.abandoned

    def open_targets(self) -> set[int]:
        """Targets the broadcast still serves: not confirmed, not handed over."""
        return self.targets - self.confirmed - self.abandoned

    def stalled(self, robot: int, now: float, max_passes: int, max_s: float) -> str | None:
        """Why ``robot``'s repair has stalled, or None: after the first pass was on air, its
        REPORTs after ``max_passes`` repair passes showed no new fragment, or it gained none for
        ``max_s`` seconds of the MAC's clock (``now``: that clock). A robot that does not answer
        its grants (no REPORT) stalls on the time only; one that answers but keeps missing what
        is repaired, on the passes.
        """
        if self.done() or robot not in self.open_targets() or self.pass_out is None:
            return None
        n = self.passes_since.get(robot, 0)
        held = f"{self.received.get(robot, 0)}/{self.count} fragments"
        if n >= max_passes:
            return f"{n} repair passes without progress, {held}"
        since = self.last_progress.get(robot, self.pass_out)
        if now - since >= max_s:
            return f"no progress for {now - since:.1f} s, {held}"
        return None

    def abandon(self, robot: int) -> None:
        """Stop serving ``robot`` (its owner sends it the message another way); thread-safe:
        the MAC applies it at its next schedule, and finishes the broadcast when every other
        target has confirmed."""
        with self._lock:
            if robot in self.targets:
                self._abandon_req.add(robot)

    def _take_abandoned(self) -> set[int]:
        with self._lock:
            req, self._abandon_req = self._abandon_req, set()
        req -= self.abandoned | self.confirmed
        self.abandoned |= req
        return req

    def _note_report(self, robot: int, got: int, now: float) -> None:
        """A REPORT said ``robot`` holds ``got`` fragments: progress when that grew; a report
        after a repair pass that brought it nothing counts one pass without progress (passes
        while it was not heard from do not: they may have reached it)."""
        seen = self._pass_at_report.get(robot, 1)
        self._pass_at_report[robot] = self.passes
        if got > self.received.get(robot, 0):
            self.received[robot] = got
            self.last_progress[robot] = now
            self.passes_since[robot] = 0
        elif self.passes > seen:
            self.passes_since[robot] = self.passes_since.get(robot, 0) + 1

    def wait(self, timeout: float | None = None) -> bool:
        """Block until finished (threaded owners)."""
        return self._event.wait(timeout)

    def _finish(self, now: float, reason: str) -> None:
        if self.finished is None:
            self.finished = now
            self.reason = reason
            self._event.set()


class _Bcast:
    def __init__(self, handle: BroadcastHandle, frames: list[bytes], deadline: float) -> None:
        self.h = handle
        self.frames = frames
        self.deadline = deadline
        self.unsent = 0  # frames of the current pass still in the server queue
        self.awaiting: set[int] = set()  # unconfirmed targets not yet polled since the pass
        self.missing: set[int] = set()
        # link adaptation: every fragment put on air, in order, and per target where it was
        # in that log and what it missed at its last REPORT (its losses since then)
        self.sent_log: list[int] = []
        self.seen_at: dict[int, int] = {}
        self.held_gaps: dict[int, set[int]] = {}


@dataclass
class _Member:
    robot: int
    heard: int | None = None  # frames received in its last grant whose REPORT came
    backlog: int = 0
    want: bool = True  # has something for us or owes us something: poll soon
    missed: int = 0
    next_poll: float = 0.0
    joined: float = 0.0


@dataclass
class _Grant:
    robot: int
    seq: int
    expires: float
    bcasts: list[int] = field(default_factory=list)
    mcs: int | None = None
    budget: int = 0
    rx_frames: int = 0  # the robot's link frames received while the grant was open
    rx_bytes: int = 0


@dataclass
class RobotLink:
    """What the server knows of one robot's link (link adaptation; for logs and reports)."""

    up_snr_db: float | None = None  # last SNR the server measured on the robot's frames
    down_snr_db: float | None = None  # last SNR the robot reported of the server's frames
    up_mcs: int | None = None  # MCS of the robot's last grant
    up_frames: int = 0  # link frames of its bursts the robot sent (its REPORTs)
    up_lost: int = 0  # ... of them not received
    bytes_up_by_mcs: dict[str, int] = field(default_factory=dict)  # received, by grant MCS
    bytes_down_by_mcs: dict[str, int] = field(default_factory=dict)  # unicast DATA sent to it


class MacServer:
    """The scheduler on the server (see the module docstring)."""

    def __init__(
        self,
        endpoint: ArqEndpoint,
        phy_transmit: Callable[[bytes], None],
        config: MacConfig | None = None,
        members: Iterable[int] = (),
        seed: int | None = None,
    ) -> None:
        self.ep = endpoint
        _under_mac(endpoint)
        self.node_id = endpoint.node_id
        self.clock = endpoint.clock
        self.config = config or MacConfig()
        self.phy_transmit = phy_transmit
        self.stats = MacStats()
        self.rng = random.Random(seed)
        self.members: dict[int, _Member] = {}
        self._order: deque[int] = deque()
        self._q = _TxQueue(self.stats)
        self._bq: deque[tuple[_Bcast, int]] = deque()  # broadcast fragments, before unicast
        self._bcasts: dict[int, _Bcast] = {}
        self._grant: _Grant | None = None
        self._grant_seq = self.rng.getrandbits(31)
        self._bcast_id = self.rng.getrandbits(32) % MAC_MSG_ID  # never the MAC's own id
        self._air_until = self.clock()
        self._quiet_until = 0.0
        self._next_beacon = self.clock()
        self._admitted: list[int] = []
        self.on_member: Callable[[int], None] | None = None
        # link adaptation (MacConfig.mcs): the uplink policy steers each robot's grants from
        # what the server hears of it, the downlink policy the frames to it (and the
        # broadcast, at the weakest open target's) from what it reports
        cfg = self.config
        self._mode = None if cfg.mcs is None else parse_mcs(cfg.mcs)
        pcfg = McsPolicyConfig(
            margin_db=cfg.mcs_margin_db,
            up_after=cfg.mcs_up_after,
            hold=cfg.mcs_hold,
            fallback_after=cfg.mcs_fallback_after,
            stale_s=cfg.mcs_stale_s,
        )
        self.up = McsPolicy(pcfg, clock=self.clock)
        self.down = McsPolicy(pcfg, clock=self.clock)
        self._ctl_mcs = cfg.control_index
        self.links: dict[int, RobotLink] = {}
        # no SNR measured yet by anyone (a frame hub without a PHY model never measures one):
        # frames go without an MCS, at the PHY's one rate, until the first SNR comes in
        self._snr_seen = False
        self.bytes_by_mcs: dict[str, int] = {}  # every frame this server put on air, by MCS
        self.bcast_mcs: int | None = None  # MCS of the last broadcast frame
        self.on_mcs: Callable[[str, int, int | None, float | None], None] | None = None
        endpoint.transmit = self._q.put
        endpoint.on_peer_report = self._on_peer_report
        for r in members:
            self._admit(r, announce=False)

    # -- owner API -------------------------------------------------------------------------
    def on_frame(self, raw: bytes, snr_db: float | None = None) -> None:
        """One frame off the air: MAC control handled here, link frames go to the ARQ.

        ``snr_db``: the SNR the PHY measured on it (link adaptation: what the server hears of
        the robot that sent it)."""
        raw = bytes(raw)
        now = self.clock()
        if is_mac_frame(raw):
            self.stats.control_bytes_rx += len(raw)
            try:
                f = mac_from_air(raw)
                if f.dst not in (self.node_id, BROADCAST) or f.src == self.node_id:
                    self.stats.not_for_us += 1
                elif f.type is MacType.REPORT:
                    self._on_report(f, now, snr_db)
                elif f.type is MacType.JOIN:
                    self._on_join(f)
                else:
                    self.stats.not_for_us += 1
            except MacFrameError as exc:
                self.stats.bad_frames += 1
                logger.debug("bad MAC frame: %s", exc)
        else:
            key = _frame_key(raw)
            if key is not None and key[1] in self.members:
                m = self.members[key[1]]
                m.missed = 0
                g = self._grant
                if g is not None and g.robot == key[1]:
                    g.rx_frames += 1
                    if key[0] == FrameType.DATA:
                        g.rx_bytes += len(raw)
                if snr_db is not None:
                    self._link(key[1]).up_snr_db = float(snr_db)
                    self._snr_seen = True
            self.ep.on_frame(raw, snr_db)
        self._schedule(now)

    def poll(self) -> None:
        """Run the ARQ's timers, then the schedule."""
        self.ep.poll()
        self._schedule(self.clock())

    def next_deadline(self) -> float | None:
        """Earliest clock time at which ``poll`` has work."""
        times = [t for t in (self.ep.next_deadline(), self._mac_deadline()) if t is not None]
        return min(times) if times else None

    def add_member(self, robot: int) -> None:
        """Admit a robot without JOIN (a configured membership)."""
        self._admit(robot, announce=False)

    def broadcast(
        self, payload: bytes, targets: Iterable[int], deadline: float = 60.0
    ) -> BroadcastHandle:
        """Send ``payload`` once to every target (a multicast); repair what they report missing."""
        now = self.clock()
        targets = {int(t) for t in targets}
        unknown = targets - set(self.members)
        if unknown:
            raise ValueError(f"robots {sorted(unknown)} are not members of the MAC")
        msg_id = self._bcast_id
        self._bcast_id = (self._bcast_id + 1) % MAC_MSG_ID
        frames = fragment(payload, msg_id, self.node_id, BROADCAST, self.ep.config.mtu)
        h = BroadcastHandle(msg_id, len(frames), len(payload), targets, now)
        b = _Bcast(h, frames, now + deadline)
        self._bcasts[msg_id] = b
        if not targets:
            h._finish(now, "no targets")
            return h
        self._queue_pass(b, range(len(frames)))
        self._schedule(now)
        return h

    def remove_member(self, robot: int) -> None:
        """Stop polling a robot."""
        self.members.pop(robot, None)
        if robot in self._order:
            self._order.remove(robot)

    @property
    def busy(self) -> bool:
        """Something queued, a grant open or a broadcast unfinished."""
        return bool(self._q) or bool(self._bq) or self._grant is not None or bool(self._bcasts)

    # -- internals -------------------------------------------------------------------------
    def _admit(self, robot: int, announce: bool = True) -> None:
        if robot in self.members or robot in (self.node_id, BROADCAST):
            return
        if len(self.members) >= self.config.max_members:
            logger.warning("MAC full: JOIN of %d ignored", robot)
            return
        self.members[robot] = _Member(robot, joined=self.clock())
        self._order.append(robot)
        self.stats.admitted += 1
        if announce:
            self._admitted.append(robot)
        if self.on_member is not None:
            self.on_member(robot)

    def _queue_pass(self, b: _Bcast, seqs: Iterable[int]) -> None:
        n = 0
        for s in seqs:
            self._bq.append((b, s))
            n += 1
        b.unsent += n
        b.h.passes += 1
        self.stats.bcast_passes += 1
        if b.h.passes > 1:
            self.stats.bcast_repair_frames += n

    def _tx(self, raw: bytes, control: bool, mcs: int | None = None) -> None:
        now = self.clock()
        if control and self._ctl_mcs is not None:
            mcs = self._ctl_mcs
        self._air_until = max(now, self._air_until) + self.config.airtime(len(raw), mcs)
        if control:
            self.stats.control_bytes_tx += len(raw)
        else:
            self.stats.link_frames_tx += 1
            self.stats.link_bytes_tx += len(raw)
        if mcs is None:
            self.phy_transmit(raw)
        else:
            name = MCS_TABLE[mcs].name
            self.bytes_by_mcs[name] = self.bytes_by_mcs.get(name, 0) + len(raw)
            self.phy_transmit(raw, mcs)  # type: ignore[call-arg]

    # -- link adaptation -------------------------------------------------------------------
    def _link(self, robot: int) -> RobotLink:
        lk = self.links.get(robot)
        if lk is None:
            lk = self.links[robot] = RobotLink()
        return lk

    def _fixed(self) -> int | None:
        """The one MCS of a fixed-MCS configuration, None when adaptive or without MCS."""
        m = self._mode
        return None if m is None or isinstance(m, str) else m.index

    def _no_mcs(self) -> bool:
        """No MCS to choose: the PHY has one rate, or adaptive with no SNR measured yet."""
        return self._mode is None or (self._fixed() is None and not self._snr_seen)

    def mcs_up(self, robot: int) -> int | None:
        """MCS of ``robot``'s DATA in its next grant (None: the PHY's one rate)."""
        if self._no_mcs():
            return None
        fixed = self._fixed()
        return fixed if fixed is not None else self.up.choose(robot)

    def mcs_down(self, robot: int) -> int | None:
        """MCS of the server's unicast DATA to ``robot``."""
        if self._no_mcs():
            return None
        fixed = self._fixed()
        return fixed if fixed is not None else self.down.choose(robot)

    def mcs_broadcast(self, targets: Iterable[int]) -> int | None:
        """MCS of a broadcast to ``targets``: the weakest target's downlink MCS."""
        if self._no_mcs():
            return None
        fixed = self._fixed()
        if fixed is not None:
            return fixed
        rungs = [self.down.position(r) for r in targets]
        return self.down.ladder[min(rungs)].index if rungs else self.down.robust

    def _grant_budget(self, mcs: int | None) -> int:
        """Bytes of one grant: ``grant_bytes``, and with an MCS at most ``burst_s`` of airtime."""
        cfg = self.config
        if mcs is None:
            return cfg.grant_bytes
        mtu = self.ep.config.mtu
        frames = max(2, int(cfg.burst_s / cfg.airtime(mtu, mcs)))
        return min(cfg.grant_bytes, frames * mtu)

    def _on_peer_report(self, peer: int, snr_db: float | None, acked: int, lost: int) -> None:
        """An ACK from ``peer`` of the server's unicast DATA: its SNR and losses steer the
        downlink MCS to it."""
        if self._mode is None or peer not in self.members:
            return
        if snr_db is not None:
            self._snr_seen = True
            self._link(peer).down_snr_db = snr_db
            self.down.report(peer, snr_db)
        self.down.outcome(peer, acked + lost, lost)

    def _note_fallbacks(self) -> None:
        self.stats.mcs_fallbacks = sum(
            p.snapshot(r).get("fallbacks", 0) for p in (self.up, self.down) for r in self.links
        )

    def adaptation(self) -> dict[str, object]:
        """Per robot: SNRs, the MCS of each direction, frames lost, bytes by MCS; the broadcast's
        MCS; the server's bytes on air by MCS (plain data, for logs and reports)."""
        robots = {}
        for r, lk in sorted(self.links.items()):
            up, down = self.mcs_up(r), self.mcs_down(r)
            robots[r] = {
                "up_snr_db": lk.up_snr_db,
                "down_snr_db": lk.down_snr_db,
                "up_mcs": None if up is None else MCS_TABLE[up].name,
                "down_mcs": None if down is None else MCS_TABLE[down].name,
                "up_frames": lk.up_frames,
                "up_lost": lk.up_lost,
                "bytes_up_by_mcs": dict(lk.bytes_up_by_mcs),
                "bytes_down_by_mcs": dict(lk.bytes_down_by_mcs),
                "fallbacks": self.up.snapshot(r).get("fallbacks", 0)
                + self.down.snapshot(r).get("fallbacks", 0),
            }
        return {
            "mode": None if self._mode is None else self.config.mcs,
            "robots": robots,
            "broadcast_mcs": None if self.bcast_mcs is None else MCS_TABLE[self.bcast_mcs].name,
            "server_bytes_by_mcs": dict(self.bytes_by_mcs),
        }

    def _on_join(self, f: MacFrame) -> None:
        if len(f.body) != _JOIN.size:
            raise MacFrameError("JOIN length")
        self.stats.joins_rx += 1
        if f.src in self.members:  # it missed the BEACON that admitted it
            self._admitted.append(f.src)
        self._admit(f.src)

    def _on_report(self, f: MacFrame, now: float, snr_db: float | None = None) -> None:
        rep = _parse_report(f.body)
        seq, backlog, items = rep.seq, rep.backlog, rep.items
        m = self.members.get(f.src)
        if m is None:
            self.stats.not_for_us += 1
            return
        self.stats.reports_rx += 1
        lk = self._link(f.src)
        g = self._grant
        burst_lost = 0
        if g is not None and g.robot == f.src and g.seq == seq:
            # ACKs of everything the burst brought go out before any grant to this robot
            self.ep.flush_acks(f.src)
            # the burst's fate: the REPORT says how many frames went out, we count what came
            lost = burst_lost = max(0, rep.sent - g.rx_frames)
            m.heard = g.rx_frames
            lk.up_frames += rep.sent
            lk.up_lost += lost
            if g.mcs is not None:
                name = MCS_TABLE[g.mcs].name
                lk.bytes_up_by_mcs[name] = lk.bytes_up_by_mcs.get(name, 0) + g.rx_bytes
            if self._mode is not None:
                if snr_db is not None:  # what the server hears of it now (the REPORT's SNR)
                    self._snr_seen = True
                    lk.up_snr_db = float(snr_db)
                    self.up.report(f.src, float(snr_db))
                self.up.outcome(f.src, rep.sent, lost)
        if self._mode is not None and rep.snr_db is not None:
            self._snr_seen = True
            lk.down_snr_db = rep.snr_db
            self.down.report(f.src, rep.snr_db)
        m.backlog = backlog
        m.missed = 0
        m.want = backlog > 0 or burst_lost > 0  # frames lost: it has them to send again
        m.next_poll = now + self.config.idle_poll_s
        for it in items:
            b = self._bcasts.get(it.msg_id)
            if b is None or it.count != b.h.count or f.src not in b.h.targets:
                continue
            b.awaiting.discard(f.src)
            if f.src in b.h.abandoned:  # handed over to a unicast: its gaps are not repaired
                self._bcast_progress(b, now)
                continue
            gaps = [] if it.complete else it.missing()
            self._bcast_losses(b, f.src, gaps)
            if it.complete:
                b.h.confirmed.add(f.src)
                b.h._note_report(f.src, b.h.count, now)
            else:
                b.missing.update(gaps)
                b.h._note_report(f.src, b.h.count - len(gaps), now)
            self._bcast_progress(b, now)
        if g is not None and g.robot == f.src and g.seq == seq:
            self._grant = None
        self._note_fallbacks()

    def _bcast_losses(self, b: _Bcast, robot: int, gaps: list[int]) -> None:
        """Downlink losses of ``robot`` on broadcast ``b`` since its last REPORT: of the frames
        sent since then that it lacked, those it still lacks (link adaptation)."""
        start = b.seen_at.get(robot, 0)
        b.seen_at[robot] = len(b.sent_log)
        held = b.held_gaps.get(robot)
        now_gaps = set(gaps)
        b.held_gaps[robot] = now_gaps
        if self._mode is None:
            return
        wanted = [s for s in b.sent_log[start:] if held is None or s in held]
        if wanted:
            lost = sum(1 for s in set(wanted) if s in now_gaps)
            self.down.outcome(robot, len(set(wanted)), lost)

    def _bcast_progress(self, b: _Bcast, now: float) -> None:
        h = b.h
        if h.done():
            return
        if h.ok:
            h._finish(now, "delivered")
            self._bcasts.pop(h.msg_id, None)
            return
        if b.unsent or b.awaiting:
            return
        unconfirmed = h.open_targets()
        if b.missing:
            self._queue_pass(b, sorted(b.missing))
            b.missing = set()
        else:  # nobody reported a gap (silent robots): poll them again
            b.awaiting = set(unconfirmed)
            for r in unconfirmed:
                if r in self.members:
                    self.members[r].want = True

    def _mac_deadline(self) -> float | None:
        now = self.clock()
        times = [b.deadline for b in self._bcasts.values()]
        if self._grant is not None:
            times.append(self._grant.expires)
            return min(times)
        if self._q or self._bq:
            times.append(max(now, self._quiet_until))
        if self.config.contention_slots:
            times.append(self._next_beacon)
        for m in self.members.values():
            times.append(max(self._quiet_until, now if m.want and not m.missed else m.next_poll))
        return min(times) if times else None

    def _schedule(self, now: float) -> None:
        cfg = self.config
        for b in list(self._bcasts.values()):
            if now >= b.deadline and not b.h.done():
                b.h._finish(now, "deadline")
                self._bcasts.pop(b.h.msg_id, None)
                continue
            gone = b.h._take_abandoned()
            if gone:  # targets the owner now serves by unicast
                self.stats.bcast_abandoned += len(gone)
                b.awaiting -= gone
                self._bcast_progress(b, now)
        g = self._grant
        if g is not None:
            if now < g.expires:
                return
            self._grant = None
            self.stats.grant_timeouts += 1
            m = self.members.get(g.robot)
            if self._mode is not None and m is not None:
                # GRANT or REPORT lost, both at the control MCS: a deep fade (or gone)
                self.up.lost(g.robot)
                self.down.lost(g.robot)
                self._note_fallbacks()
            if m is not None:
                m.missed += 1
                if m.missed <= cfg.quick_retries:
                    back = cfg.miss_retry_s
                else:
                    k = m.missed - cfg.quick_retries - 1
                    back = min(cfg.max_poll_interval_s, cfg.idle_poll_s * 2**k)
                m.next_poll = now + back
            for mid in g.bcasts:
                b = self._bcasts.get(mid)
                if b is not None:
                    b.awaiting.discard(g.robot)
                    self._bcast_progress(b, now)
        if now < self._quiet_until:
            return
        # downlink burst: broadcast frames, then unicast frames and ACKs of the ARQ (with an
        # MCS: at most burst_s of airtime)
        used = 0
        t_end = max(now, self._air_until) + cfg.burst_s
        while self._bq and used < cfg.downlink_bytes:
            if self._mode is not None and used and self._air_until >= t_end:
                break
            b, seq = self._bq.popleft()
            raw = b.frames[seq]
            b.unsent -= 1
            if b.h.done():
                continue
            mcs = self.mcs_broadcast(b.h.open_targets())
            self.bcast_mcs = mcs
            self._tx(raw, control=False, mcs=mcs)
            b.sent_log.append(seq)
            used += len(raw)
            b.h.frames_sent += 1
            self.stats.bcast_frames_tx += 1
            self.stats.bcast_bytes_tx += len(raw)
            if b.unsent == 0:
                if b.h.pass_out is None:
                    b.h.pass_out = now  # the first pass is on air: stall times count from here
                b.awaiting = b.h.open_targets()
                for r in b.awaiting:
                    if r in self.members:
                        self.members[r].want = True
        left = max(0, cfg.downlink_bytes - used)
        if self._mode is not None and used and self._air_until >= t_end:
            left = self._q.control_bytes  # ACKs go out whatever the burst's length
        for raw in self._q.pop_upto(left):
            key = _frame_key(raw)
            mcs = None
            if key is not None and key[2] in self.members:
                self.members[key[2]].want = True  # it owes us ACKs: poll it soon
                if key[0] == FrameType.DATA:
                    mcs = self.mcs_down(key[2])
                    if mcs is not None:
                        lk = self._link(key[2]).bytes_down_by_mcs
                        lk[MCS_TABLE[mcs].name] = lk.get(MCS_TABLE[mcs].name, 0) + len(raw)
            self._tx(raw, control=key is None or key[0] != FrameType.DATA, mcs=mcs)
        if cfg.contention_slots and now >= self._next_beacon:
            self._send_beacon(now)
            return
        r = self._pick(now)
        if r is not None:
            self._send_grant(r, now)

    def _send_beacon(self, now: float) -> None:
        cfg = self.config
        slot = cfg.airtime(FRAME_OVERHEAD + MAC_OVERHEAD + _JOIN.size, self._ctl_mcs) + cfg.guard_s
        admitted, self._admitted = self._admitted[:600], self._admitted[600:]
        raw = mac_on_air(
            encode_mac(
                MacType.BEACON,
                self.node_id,
                BROADCAST,
                _beacon_body(cfg.contention_slots, slot, admitted),
            ),
            self.node_id,
            BROADCAST,
        )
        self._tx(raw, control=True)
        self.stats.beacons_tx += 1
        self._next_beacon = now + cfg.beacon_interval_s
        self._quiet_until = (
            self._air_until + cfg.turnaround_s + cfg.contention_slots * slot + cfg.guard_s
        )

    def _pick(self, now: float) -> int | None:
        """Next robot to grant: round robin over robots with work, then idle ones due a poll.

        A robot has work while its last REPORT said it has bytes waiting to be sent or its
        burst lost frames (not while its frames are in flight, waiting for their ACKs: such a
        robot, polled back to back, starved the others), or the server owes it or expects
        something from it."""
        n = len(self._order)
        due = None
        for i in range(n):
            r = self._order[i]
            m = self.members[r]
            if m.missed:
                if now >= m.next_poll and due is None:
                    due = i
                continue
            if m.want or m.backlog:
                self._order.rotate(-(i + 1))
                return r
            if now >= m.next_poll and due is None:
                due = i
        if due is None:
            return None
        r = self._order[due]
        self._order.rotate(-(due + 1))
        return r

    def _send_grant(self, r: int, now: float) -> None:
        cfg = self.config
        m = self.members[r]
        refs = [b for b in self._bcasts.values() if r in b.h.open_targets() and b.unsent == 0][
            :MAX_BCAST_PER_GRANT
        ]
        self._grant_seq = (self._grant_seq + 1) & 0xFFFFFFFF
        mcs = self.mcs_up(r)
        budget = self._grant_budget(mcs)
        body = _grant_body(
            self._grant_seq, budget, [(b.h.msg_id, b.h.count) for b in refs], mcs, m.heard
        )
        m.heard = None  # told once: the next GRANT speaks of this grant's burst
        raw = mac_on_air(encode_mac(MacType.GRANT, self.node_id, r, body), self.node_id, r)
        self._tx(raw, control=True)
        self.stats.grants_tx += 1
        mtu = self.ep.config.mtu
        frames = budget // mtu + 2
        report = (
            MAC_OVERHEAD + _REPORT.size + len(refs) * (_REPORT_ITEM.size + cfg.report_bitmap_bytes)
        )
        if mcs is None:
            air = (budget + report) / cfg.rate_bytes_per_s + frames * cfg.preamble_s
        else:  # DATA at the grant's MCS, the REPORT (and the robot's ACKs) at the control MCS
            air = frames * cfg.airtime(mtu, mcs) + cfg.airtime(
                FRAME_OVERHEAD + report, self._ctl_mcs
            )
        window = cfg.turnaround_s + air + cfg.guard_s
        self._grant = _Grant(
            r,
            self._grant_seq,
            self._air_until + window,
            [b.h.msg_id for b in refs],
            mcs=mcs,
            budget=budget,
        )
        self._link(r).up_mcs = mcs
        if self.on_mcs is not None:
            self.on_mcs("grant", r, mcs, self._link(r).up_snr_db)
        m.want = False
        m.next_poll = now + cfg.idle_poll_s
