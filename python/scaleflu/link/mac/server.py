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


@dataclass
class _Member:
    robot: int
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
        self._bq: deque[tuple[_Bcast, bytes]] = deque()  # broadcast frames, before unicast
        self._bcasts: dict[int, _Bcast] = {}
        self._grant: _Grant | None = None
        self._grant_seq = self.rng.getrandbits(31)
        self._bcast_id = self.rng.getrandbits(32) % MAC_MSG_ID  # never the MAC's own id
        self._air_until = self.clock()
        self._quiet_until = 0.0
        self._next_beacon = self.clock()
        self._admitted: list[int] = []
        self.on_member: Callable[[int], None] | None = None
        endpoint.transmit = self._q.put
        for r in members:
            self._admit(r, announce=False)

    # -- owner API -------------------------------------------------------------------------
    def on_frame(self, raw: bytes) -> None:
        """One frame off the air: MAC control handled here, link frames go to the ARQ."""
        raw = bytes(raw)
        now = self.clock()
        if is_mac_frame(raw):
            self.stats.control_bytes_rx += len(raw)
            try:
                f = mac_from_air(raw)
                if f.dst not in (self.node_id, BROADCAST) or f.src == self.node_id:
                    self.stats.not_for_us += 1
                elif f.type is MacType.REPORT:
                    self._on_report(f, now)
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
            self.ep.on_frame(raw)
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
            self._bq.append((b, b.frames[s]))
            n += 1
        b.unsent += n
        b.h.passes += 1
        self.stats.bcast_passes += 1
        if b.h.passes > 1:
            self.stats.bcast_repair_frames += n

    def _tx(self, raw: bytes, control: bool) -> None:
        now = self.clock()
        self._air_until = max(now, self._air_until) + self.config.airtime(len(raw))
        if control:
            self.stats.control_bytes_tx += len(raw)
        else:
            self.stats.link_frames_tx += 1
            self.stats.link_bytes_tx += len(raw)
        self.phy_transmit(raw)

    def _on_join(self, f: MacFrame) -> None:
        if len(f.body) != _JOIN.size:
            raise MacFrameError("JOIN length")
        self.stats.joins_rx += 1
        if f.src in self.members:  # it missed the BEACON that admitted it
            self._admitted.append(f.src)
        self._admit(f.src)

    def _on_report(self, f: MacFrame, now: float) -> None:
        seq, backlog, items = _parse_report(f.body)
        m = self.members.get(f.src)
        if m is None:
            self.stats.not_for_us += 1
            return
        self.stats.reports_rx += 1
        m.backlog = backlog
        m.missed = 0
        m.want = backlog > 0
        m.next_poll = now + self.config.idle_poll_s
        for it in items:
            b = self._bcasts.get(it.msg_id)
            if b is None or it.count != b.h.count or f.src not in b.h.targets:
                continue
            b.awaiting.discard(f.src)
            if f.src in b.h.abandoned:  # handed over to a unicast: its gaps are not repaired
                self._bcast_progress(b, now)
                continue
            if it.complete:
                b.h.confirmed.add(f.src)
                b.h._note_report(f.src, b.h.count, now)
            else:
                gaps = it.missing()
                b.missing.update(gaps)
                b.h._note_report(f.src, b.h.count - len(gaps), now)
            self._bcast_progress(b, now)
        g = self._grant
        if g is not None and g.robot == f.src and g.seq == seq:
            self._grant = None

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
        # downlink burst: broadcast frames, then unicast frames and ACKs of the ARQ
        used = 0
        while self._bq and used < cfg.downlink_bytes:
            b, raw = self._bq.popleft()
            b.unsent -= 1
            if b.h.done():
                continue
            self._tx(raw, control=False)
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
        for raw in self._q.pop_upto(max(0, cfg.downlink_bytes - used)):
            key = _frame_key(raw)
            if key is not None and key[2] in self.members:
                self.members[key[2]].want = True  # it owes us ACKs: poll it soon
            self._tx(raw, control=key is None or key[0] != FrameType.DATA)
        if cfg.contention_slots and now >= self._next_beacon:
            self._send_beacon(now)
            return
        r = self._pick(now)
        if r is not None:
            self._send_grant(r, now)

    def _send_beacon(self, now: float) -> None:
        cfg = self.config
        slot = cfg.airtime(FRAME_OVERHEAD + MAC_OVERHEAD + _JOIN.size) + cfg.guard_s
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
        """Next robot to grant: round robin over robots with work, then idle ones due a poll."""
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
        body = _grant_body(
            self._grant_seq, cfg.grant_bytes, [(b.h.msg_id, b.h.count) for b in refs]
        )
        raw = mac_on_air(encode_mac(MacType.GRANT, self.node_id, r, body), self.node_id, r)
        self._tx(raw, control=True)
        self.stats.grants_tx += 1
        mtu = self.ep.config.mtu
        frames = cfg.grant_bytes // mtu + 2
        report = (
            MAC_OVERHEAD + _REPORT.size + len(refs) * (_REPORT_ITEM.size + cfg.report_bitmap_bytes)
        )
        window = (
            cfg.turnaround_s
            + (cfg.grant_bytes + report) / cfg.rate_bytes_per_s
            + frames * cfg.preamble_s
            + cfg.guard_s
        )
        self._grant = _Grant(
            r, self._grant_seq, self._air_until + window, [b.h.msg_id for b in refs]
        )
        m.want = False
        m.next_poll = now + cfg.idle_poll_s
