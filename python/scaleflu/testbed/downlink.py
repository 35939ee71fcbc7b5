"""Model sends of the edge server: unicast or broadcast, delta encoding, what each robot holds,
and the age of information (AoI) of the parameter groups at the robots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaleflu.link.arq import SendHandle
from scaleflu.testbed.common import arrays, cast_like, decode_state, encode_state
from scaleflu.testbed.keys import sign
from scaleflu.testbed.protocol import (
    MsgType,
    state_sha256,
)
from scaleflu.testbed.sessions import RobotInfo
from scaleflu.testbed.transport import (
    JointHandle,
    link_stats,
    pack_broadcast_body,
)

log = logging.getLogger(__name__)


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
    changed: set[tuple[str, int]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    # a broadcast send: the state and meta it was made from, for a unicast in its place when
    # the robot's broadcast repair stalls (_fall_back_to_unicast)
    source: dict[str, torch.Tensor] | None = None
    extra: dict[str, Any] | None = None
    send_id: int = 0


class DownlinkMixin:
    """Sending models to the robots and accounting what they hold."""

    def _all_groups(self) -> list[tuple[str, int]]:
        return [(layer, j) for layer, g in self.groups.items() for j in range(len(g))]

    def _send_model(
        self,
        robot: RobotInfo,
        state: dict[str, torch.Tensor],
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
        ref = robot.held if tb.broadcast == "delta" and robot.held is not None else None
        enc = str(tb.broadcast_encoding)
        G = int(self.cfg.scale.groups_per_layer)
        body = encode_state(wire, enc, ref, G)
        # What the robot will hold: decode our own bytes (lossy encodings included).
        held = cast_like(decode_state(body, reference=ref), wire)
        sha = state_sha256(held)
        base = robot.held_sha if ref is not None else None
        meta = self._model_meta(robot.robot_id, t, purpose, sha, base, extra, send_id=send_id)
        h = self.ep.send(
            MsgType.MODEL,
            robot.robot_id,
            self.keys[robot.robot_id],
            self.session,
            t,
            meta,
            body,
            timeout=float(tb.send_timeout_s),
        )
        changed = {
            g for g in self._all_groups() if self._group_changed(g, state, self._prev_broadcast)
        }
        out = Outgoing(robot.robot_id, h, held, sha, src_sha, purpose, t, changed, send_id=send_id)
        self.outgoing.append(out)
        log.info(
            "%s model r%d -> robot %d: %d B (%s)",
            purpose,
            t,
            robot.robot_id,
            len(body),
            "delta" if ref is not None else "full",
        )
        return out

    def _send_model_many(
        self,
        robots: list[RobotInfo],
        state: dict[str, torch.Tensor],
        purpose: str,
        t: int,
        extra: dict[str, Any] | None = None,
        src_sha: str | None = None,
    ) -> list[Outgoing]:
        """Send ``state`` to several robots: one broadcast per distinct body over a MAC link.

        ``testbed.downlink``: ``unicast`` sends one model per robot (``_send_model``);
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
            return [self._send_model(rb, state, purpose, t, extra, src_sha) for rb in robots]
        wire = arrays(state)
        src_sha = src_sha or state_sha256(wire)
        enc = str(tb.broadcast_encoding)
        G = int(self.cfg.scale.groups_per_layer)
        groups: dict[str | None, list[RobotInfo]] = {}
        for rb in robots:
            delta = tb.broadcast == "delta" and rb.held is not None
            groups.setdefault(rb.held_sha if delta else None, []).append(rb)
        changed = {
            g for g in self._all_groups() if self._group_changed(g, state, self._prev_broadcast)
        }
        timeout = float(tb.send_timeout_s)
        send_id = self._next_send_id()
        outs: list[Outgoing] = []
        for base, members in groups.items():
            ref = members[0].held if base is not None else None
            body = encode_state(wire, enc, ref, G)
            held = cast_like(decode_state(body, reference=ref), wire)
            sha = state_sha256(held)
            body_sha, packed = pack_broadcast_body(body)
            bh = bcast(packed, [rb.robot_id for rb in members], timeout=timeout)
            log.info(
                "%s model r%d -> robots %s: %d B once (%s, broadcast)",
                purpose,
                t,
                [rb.robot_id for rb in members],
                len(body),
                "delta" if ref is not None else "full",
            )
            for rb in members:
                # signed as a unicast MODEL: robots verify it over the state they decoded from
                # the broadcast body (its SHA-256), so an unsigned or re-signed body is refused
                meta = self._model_meta(
                    rb.robot_id, t, purpose, sha, base, extra, body_sha256=body_sha, send_id=send_id
                )
                h = self.ep.send(
                    MsgType.MODEL,
                    rb.robot_id,
                    self.keys[rb.robot_id],
                    self.session,
                    t,
                    meta,
                    b"",
                    timeout=timeout,
                )
                joint = JointHandle(h, bh, rb.robot_id)
                out = Outgoing(
                    rb.robot_id,
                    joint,  # type: ignore[arg-type]
                    held,
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
        return outs

    def _next_send_id(self) -> int:
        self._send_seq += 1
        return self._send_seq

    def _model_meta(
        self,
        robot_id: int,
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
        deadline = max(0.0, (self.round.deadline - self.clock()) if self.round else 0)
        meta = {"purpose": purpose, "sha256": sha, "base_sha256": base, "deadline_s": deadline}
        meta = {**meta, **more, **(extra or {})}
        meta["sig"] = sign(
            self.signing_key,
            "model",
            session=self.session,
            robot=robot_id,
            round=t,
            purpose=purpose,
            sha256=sha,
        )
        return meta

    def _group_changed(
        self, g: tuple[str, int], new: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor]
    ) -> bool:
        layer, j = g
        a, b = self.groups[layer][j]
        x = new[layer].reshape(-1)[a:b].to(torch.float64)
        y = old[layer].reshape(-1)[a:b].to(torch.float64)
        return bool((x - y).abs().max() > float(self.history.update_tol))

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
            robot = self.robots.get(o.robot)
            if why is None or robot is None:
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
            self._event(
                "broadcast_fallback", robot=o.robot, round=o.round, purpose=o.purpose, reason=why
            )
            self._send_model(robot, o.source, o.purpose, o.round, o.extra, o.src_sha, o.send_id)

    def _check_sends(self) -> None:
        """Account finished model sends: what each robot holds, and AoI of the groups."""
        self._fall_back_to_unicast()
        still = []
        for o in self.outgoing:
            if not o.handle.done():
                still.append(o)
                continue
            robot = self.robots.get(o.robot)
            if o.handle.status.value == "delivered":
                if robot is not None and robot.resync_at < o.started:
                    robot.held, robot.held_sha, robot.held_src = o.state, o.sha, o.src_sha
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
                if robot is not None:
                    robot.held, robot.held_sha, robot.held_src = None, None, None
        self.outgoing = still

    def aoi_seconds(self) -> float:
        """Mean age (s) over parameter groups of their latest version at the robots."""
        now = time.monotonic() - self.t0
        vals = [now - v for v in self.group_time.values()]
        return float(np.mean(vals)) if vals else 0.0

    def _air_bytes(self) -> int:
        """Bytes the server's ARQ put on the link plus what the robots report for theirs."""
        st = link_stats(self.link).get("arq", {})
        own = int(st.get("bytes_tx", self.ep.sent_bytes))
        return own + sum(r.link_bytes_tx for r in self.robots.values())

    def _needs(self, robot: RobotInfo, src_sha: str) -> bool:
        """Whether a robot should be sent the state ``src_sha``: it lacks it, none in flight."""
        if any(o.robot == robot.robot_id for o in self.outgoing):
            return False
        return robot.held is None or robot.held_src != src_sha

    def deploy(
        self, state: dict[str, torch.Tensor], purpose: str, extra: dict[str, Any], timeout: float
    ) -> dict[int, dict[str, Any]]:
        """Send a model to every registered robot and collect their evaluation reports."""
        self.eval_reports[purpose] = {}
        targets = list(self.robots.values())
        t = self.history.last_completed_round()
        src = state_sha256(arrays(state))
        sends = self._send_model_many(targets, state, purpose, t, extra, src)
        self._prev_broadcast = state
        end = self.clock() + timeout
        want = {o.robot for o in sends}
        while self.clock() < end:
            self.poll(0.2)
            # a robot that registered again (restart) or lost the model gets it (again)
            for rb in self.robots.values():
                if rb.robot_id not in self.eval_reports[purpose] and self._needs(rb, src):
                    want.add(rb.robot_id)
                    self._send_model(rb, state, purpose, t, extra, src)
            if set(self.eval_reports[purpose]) >= want:
                break
        return self.eval_reports[purpose]
