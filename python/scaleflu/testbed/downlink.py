"""Model sends of the edge server: unicast or broadcast, delta encoding, what each robot holds,
and the age of information (AoI) of the parameter groups at the robots.

A model leaves the server as a torch state dict and is put on the wire once per send
(:func:`~scaleflu.testbed.common.arrays`: the codec reads the tensors' memory). What a robot
holds is kept in the wire's form (the decoded bytes the server sent): it is the reference the
next delta is encoded against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaleflu.link import Link
from scaleflu.link.arq import SendHandle
from scaleflu.testbed.common import arrays, cast_like, decode_state, encode_state
from scaleflu.testbed.protocol import MsgType, state_sha256
from scaleflu.testbed.records import Records
from scaleflu.testbed.sessions import Sessions
from scaleflu.testbed.transport import JointHandle, link_stats, pack_broadcast_body

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]
Group = tuple[str, int]


@dataclass
class Held:
    """The model a robot holds (as delivered): its wire arrays, SHA-256, and the SHA-256 of the
    server-side state it was encoded from."""

    state: dict[str, np.ndarray]
    sha: str
    src: str


@dataclass
class Outgoing:
    """A model send in flight, with what the robot will hold once it is delivered."""

    robot: int
    handle: SendHandle
    state: dict[str, np.ndarray]
    sha: str
    src_sha: str
    purpose: str
    round: int
    changed: set[Group] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    # a broadcast send: the state and meta it was made from, for a unicast in its place when
    # the robot's broadcast repair stalls (Downlink._fall_back_to_unicast)
    source: State | None = None
    extra: dict[str, Any] | None = None
    send_id: int = 0


class Downlink:
    """Models to the robots and what they hold.

    ``groups``: the parameter groups of the AoI (``HistoryStore.groups``); ``update_tol``: the
    change above which a group counts as updated; ``tb``: the ``testbed`` config section
    (downlink mode, encodings, timeouts, broadcast stall limits); ``groups_per_layer``: the
    wire's delta groups; ``t0``: the server's start (the AoI's time origin); ``initial``: the
    model the robots start from; ``round_deadline``: the open round's deadline on ``clock``
    (None: no round open), whose time left each MODEL tells the robot.
    """

    def __init__(
        self,
        link: Link,
        sessions: Sessions,
        records: Records,
        tb: Any,
        groups_per_layer: int,
        groups: Mapping[str, Sequence[tuple[int, int]]],
        update_tol: float,
        clock: Callable[[], float],
        t0: float,
        initial: State,
        round_deadline: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.link = link
        self.sessions = sessions
        self.records = records
        self.tb = tb
        self.wire_groups = int(groups_per_layer)
        self.groups = groups
        self.update_tol = float(update_tol)
        self.clock = clock
        self.t0 = t0
        self.round_deadline = round_deadline
        self.outgoing: list[Outgoing] = []
        self.held: dict[int, Held] = {}
        self.reset_at: dict[int, float] = {}  # robot -> when it last lost what it held
        self.unicast_fallbacks = 0  # model sends moved from a stalled broadcast to a unicast
        self._send_seq = 0  # id of each model send (MODEL meta "send_id"; a fall-back keeps it)
        self.group_time: dict[Group, float] = {g: 0.0 for g in self._all_groups()}
        self._prev_broadcast = initial

    def _all_groups(self) -> list[Group]:
        return [(layer, j) for layer, g in self.groups.items() for j in range(len(g))]

    # -- what robots hold -----------------------------------------------------------------

    def forget(self, robot: int) -> None:
        """Robot ``robot`` holds no model we know of (it registered again or asked for a
        RESYNC): it gets a full model next, and sends begun before now do not count."""
        self.held.pop(robot, None)
        self.reset_at[robot] = time.monotonic()

    def held_sha(self, robot: int) -> str | None:
        """SHA-256 of the model the robot is known to hold (None: none known)."""
        held = self.held.get(robot)
        return held.sha if held is not None else None

    def needs(self, robot: int, src_sha: str) -> bool:
        """Whether a robot should be sent the state ``src_sha``: it lacks it, none in flight."""
        if any(o.robot == robot for o in self.outgoing):
            return False
        held = self.held.get(robot)
        return held is None or held.src != src_sha

    # -- sending --------------------------------------------------------------------------

    def send(
        self,
        robot: int,
        state: State,
        purpose: str,
        t: int,
        extra: dict[str, Any] | None = None,
        src_sha: str | None = None,
        send_id: int | None = None,
    ) -> Outgoing:
        """Start sending ``state`` to a robot, as a delta against what it holds when allowed.

        ``send_id``: the id in the MODEL's meta (a new one when None); a unicast that replaces
        a stalled broadcast keeps the broadcast's, so a robot that gets both trains once.
        """
        tb = self.tb
        send_id = self._next_send_id() if send_id is None else send_id
        wire = arrays(state)
        src_sha = src_sha or state_sha256(wire)
        held = self.held.get(robot) if tb.broadcast == "delta" else None
        ref = held.state if held is not None else None
        body = encode_state(wire, str(tb.broadcast_encoding), ref, self.wire_groups)
        # What the robot will hold: decode our own bytes (lossy encodings included).
        will_hold = cast_like(decode_state(body, reference=ref), wire)
        sha = state_sha256(will_hold)
        base = held.sha if held is not None else None
        meta = self._model_meta(robot, t, purpose, sha, base, extra, send_id=send_id)
        h = self.sessions.send(
            MsgType.MODEL, robot, t, meta, body, timeout=float(tb.send_timeout_s)
        )
        changed = self._changed(state)
        out = Outgoing(robot, h, will_hold, sha, src_sha, purpose, t, changed, send_id=send_id)
        self.outgoing.append(out)
        log.info(
            "%s model r%d -> robot %d: %d B (%s)",
            purpose,
            t,
            robot,
            len(body),
            "delta" if ref is not None else "full",
        )
        return out

    def send_many(
        self,
        robots: Sequence[int],
        state: State,
        purpose: str,
        t: int,
        extra: dict[str, Any] | None = None,
        src_sha: str | None = None,
    ) -> list[Outgoing]:
        """Send ``state`` to several robots: one broadcast per distinct body over a MAC link.

        ``testbed.downlink``: ``unicast`` sends one model per robot (:meth:`send`);
        ``broadcast`` (or ``auto`` on a link that can broadcast: frames-shared) puts each
        distinct body (full, or a delta against a base several robots hold) on air once and
        sends every robot a small sealed MODEL envelope naming the body's SHA-256.
        """
        tb = self.tb
        mode = str(tb.downlink)
        bcast = getattr(self.link, "broadcast", None)
        if mode == "unicast" or not callable(bcast) or not getattr(self.link, "is_server", False):
            if mode == "broadcast":
                log.warning("testbed.downlink=broadcast but the link cannot broadcast: unicast")
            outs = [self.send(r, state, purpose, t, extra, src_sha) for r in robots]
            self._prev_broadcast = state
            return outs
        wire = arrays(state)
        src_sha = src_sha or state_sha256(wire)
        by_base: dict[str | None, list[int]] = {}
        for r in robots:
            held = self.held.get(r) if tb.broadcast == "delta" else None
            by_base.setdefault(held.sha if held is not None else None, []).append(r)
        changed = self._changed(state)
        timeout = float(tb.send_timeout_s)
        send_id = self._next_send_id()
        outs: list[Outgoing] = []
        for base, members in by_base.items():
            ref = self.held[members[0]].state if base is not None else None
            body = encode_state(wire, str(tb.broadcast_encoding), ref, self.wire_groups)
            will_hold = cast_like(decode_state(body, reference=ref), wire)
            sha = state_sha256(will_hold)
            body_sha, packed = pack_broadcast_body(body)
            bh = bcast(packed, list(members), timeout=timeout)
            log.info(
                "%s model r%d -> robots %s: %d B once (%s, broadcast)",
                purpose,
                t,
                list(members),
                len(body),
                "delta" if ref is not None else "full",
            )
            for r in members:
                # signed as a unicast MODEL: robots verify it over the state they decoded from
                # the broadcast body (its SHA-256), so an unsigned or re-signed body is refused
                meta = self._model_meta(
                    r, t, purpose, sha, base, extra, body_sha256=body_sha, send_id=send_id
                )
                h = self.sessions.send(MsgType.MODEL, r, t, meta, b"", timeout=timeout)
                out = Outgoing(
                    r,
                    JointHandle(h, bh, r),  # type: ignore[arg-type]
                    will_hold,
                    sha,
                    src_sha,
                    purpose,
                    t,
                    changed,
                    source=state,
                    extra=extra,
                    send_id=send_id,  # for a unicast in its place
                )
                self.outgoing.append(out)
                outs.append(out)
        self._prev_broadcast = state
        return outs

    def _next_send_id(self) -> int:
        self._send_seq += 1
        return self._send_seq

    def _model_meta(
        self,
        robot: int,
        t: int,
        purpose: str,
        sha: str,
        base: str | None,
        extra: dict[str, Any] | None,
        **more: Any,
    ) -> dict[str, Any]:
        """A MODEL envelope's meta for one robot: purpose, the SHA-256 the robot will hold, the
        delta's base, the open round's remaining time, then ``more`` (broadcast: the body's SHA)
        and ``extra``; signed by the server over (session, robot, round, purpose, SHA-256).
        """
        deadline = self.round_deadline()
        left = max(0.0, deadline - self.clock()) if deadline is not None else 0
        meta = {"purpose": purpose, "sha256": sha, "base_sha256": base, "deadline_s": left}
        meta = {**meta, **more, **(extra or {})}
        meta["sig"] = self.sessions.sign("model", robot, round=t, purpose=purpose, sha256=sha)
        return meta

    def _changed(self, new: State) -> set[Group]:
        """The groups whose values differ (beyond ``update_tol``) from the last sent model."""
        old = self._prev_broadcast
        out = set()
        for g in self._all_groups():
            layer, j = g
            a, b = self.groups[layer][j]
            x = new[layer].reshape(-1)[a:b].to(torch.float64)
            y = old[layer].reshape(-1)[a:b].to(torch.float64)
            if bool((x - y).abs().max() > self.update_tol):
                out.add(g)
        return out

    # -- settling -------------------------------------------------------------------------

    def _fall_back_to_unicast(self) -> None:
        """Send the model by unicast to every robot whose broadcast repair stalled.

        A robot that gained no fragment of the broadcast body in
        ``testbed.broadcast_stall_passes`` repair passes, or for ``testbed.broadcast_stall_s``
        seconds of the link's clock (virtual seconds on ofdm-shared), since the first pass was
        on air: the broadcast stops serving it (``BroadcastHandle.abandon``), it gets the same
        model as a unicast MODEL (body included, ARQ), and the broadcast goes on for the others.
        Counted in ``unicast_fallbacks`` (the round's link row) and logged as an event. Without
        this, a robot the repairs never reach waits for the broadcast's deadline
        (``send_timeout_s``), and the round for it.
        """
        passes = int(self.tb.broadcast_stall_passes)
        stall_s = float(self.tb.broadcast_stall_s)
        now = self.clock()
        for o in list(self.outgoing):
            bh = getattr(o.handle, "broadcast", None)
            if bh is None or o.source is None or o.handle.done():
                continue
            why = bh.stalled(o.robot, now, passes, stall_s)
            if why is None or o.robot not in self.sessions.robots:
                continue
            bh.abandon(o.robot)
            self.outgoing.remove(o)  # superseded: its failure must not reset what robot holds
            self.unicast_fallbacks += 1
            log.warning(
                "%s model r%d: broadcast repair to robot %d stalled (%s); sending it by unicast",
                o.purpose,
                o.round,
                o.robot,
                why,
            )
            self.records.event(
                "broadcast_fallback", robot=o.robot, round=o.round, purpose=o.purpose, reason=why
            )
            self.send(o.robot, o.source, o.purpose, o.round, o.extra, o.src_sha, o.send_id)

    def check_sends(self) -> None:
        """Account finished model sends: what each robot holds, and AoI of the groups."""
        self._fall_back_to_unicast()
        still = []
        for o in self.outgoing:
            if not o.handle.done():
                still.append(o)
                continue
            known = o.robot in self.sessions.robots
            if o.handle.status.value == "delivered":
                if known and self.reset_at.get(o.robot, 0.0) < o.started:
                    self.held[o.robot] = Held(o.state, o.sha, o.src_sha)
                now = time.monotonic() - self.t0
                for g in o.changed:
                    self.group_time[g] = max(self.group_time.get(g, 0.0), now)
            else:
                log.warning(
                    "%s model r%d to robot %d failed: %s",
                    o.purpose,
                    o.round,
                    o.robot,
                    o.handle.reason,
                )
                if known:
                    self.held.pop(o.robot, None)
        self.outgoing = still

    # -- accounting -----------------------------------------------------------------------

    def aoi_seconds(self) -> float:
        """Mean age (s) over parameter groups of their latest version at the robots."""
        now = time.monotonic() - self.t0
        vals = [now - v for v in self.group_time.values()]
        return float(np.mean(vals)) if vals else 0.0

    def air_bytes(self) -> int:
        """Bytes the server's ARQ put on the link plus what the robots report for theirs."""
        st = link_stats(self.link).get("arq", {})
        own = int(st.get("bytes_tx", self.sessions.ep.sent_bytes))
        return own + sum(r.link_bytes_tx for r in self.sessions.robots.values())
