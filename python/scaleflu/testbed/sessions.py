"""Robot sessions of the edge server: registration, the session challenge, who is active."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from scaleflu.testbed.common import LinkDeadline, wait_on_clock
from scaleflu.testbed.keys import sign
from scaleflu.testbed.protocol import (
    MsgType,
    client_of,
)
from scaleflu.testbed.validation import RegisterMeta

log = logging.getLogger(__name__)


@dataclass
class RobotInfo:
    """What the server knows about one registered robot."""

    robot_id: int
    num_samples: int = 0
    registered_at: float = 0.0
    registrations: int = 0
    held: dict[str, np.ndarray] | None = None  # the model the robot holds (as delivered)
    held_sha: str | None = None
    forgotten: bool = False
    link_bytes_tx: int = 0  # the robot's own ARQ byte counter, as it last reported it
    held_src: str | None = None  # SHA-256 of the server-side state it was encoded from
    resync_at: float = 0.0  # when the robot last said it does not hold what we think
    last_nonce: str | None = None  # nonce of its last REGISTER (a retry is not a new one)
    last_heard: float = 0.0  # the server's clock (the link's) at its last authenticated message


class SessionsMixin:
    """Registration and the robots' sessions of an :class:`EdgeServer`."""

    def _on_register(self, r: int, meta: Mapping[str, Any]) -> None:
        rm = RegisterMeta.parse(meta)
        nonce, num = rm.nonce, rm.num_samples
        info = self.robots.get(r) or RobotInfo(r)
        if info.last_nonce == nonce:  # the same REGISTER again (retry): acknowledge, keep state
            self._send_register_ack(info, nonce)
            return
        info.last_nonce = nonce
        info.num_samples = num
        info.registered_at = self.clock()  # the link's clock, as last_heard and round starts
        info.last_heard = info.registered_at
        info.registrations += 1
        info.held, info.held_sha = None, None
        info.resync_at = time.monotonic()
        self.robots[r] = info
        expected = self.setup.data_sizes[client_of(r)]
        if num != expected:
            log.warning("robot %d reports %d samples, the partition has %d", r, num, expected)
        if r in self._forgotten_before:
            info.forgotten = True  # registered to evaluate the unlearned model, not to train
        self._send_register_ack(info, nonce)
        self._event("register", robot=r, registrations=info.registrations)
        log.info("robot %d registered (%d samples, registration %d)", r, num, info.registrations)

    def _send_register_ack(self, info: RobotInfo, nonce: str) -> None:
        reply = {
            "nonce": nonce,
            "accepted": True,
            "reason": "forgotten: no training" if info.forgotten else "",
            "next_round": self.history.last_completed_round() + 1,
        }
        r = info.robot_id
        reply["sig"] = sign(
            self.signing_key, "register_ack", session=self.session, robot=r, nonce=nonce
        )
        self.ep.send(MsgType.REGISTER_ACK, r, self.keys[r], self.session, 0, reply, timeout=20.0)

    def announce(self) -> None:
        """Tell every robot in the key file the (new) session, so restarted robots re-register."""
        for r, key in self.keys.items():
            self.ep.send(MsgType.SERVER_HELLO, r, key, self.session, 0, {}, timeout=5.0)

    def wait_for_robots(self, n: int, timeout: float) -> bool:
        """Handle messages until ``n`` robots are registered (and not forgotten) or timeout."""
        n = min(n, len(self.keys) - len(self._forgotten_ids()))
        end = LinkDeadline(timeout, self.clock)  # robots register over the link: its clock
        while not end.expired():
            if len(self._active()) >= n:
                return True
            self.poll(0.2)
        return len(self._active()) >= n

    def wait_for_rejoin(self, since: float, timeout: float) -> list[int]:
        """Handle messages until every registered robot has been heard from since ``since``
        (the server's clock; the start of the last round) or is forgotten, or until ``timeout``
        wall seconds.

        A robot silent since then died in the last round: if it is restarting, waiting lets it
        register again and take part in what follows (the unlearning's "before" and "after"
        evaluations, which would otherwise reach it only half). Returns the robots still silent.
        """
        # the timeout on the wall clock: a robot that died may never come back, and the MAC's
        # polls keep the shared medium at its busy speed (its clock runs at ~0.1 x the wall)
        end = time.monotonic() + timeout

        def silent() -> list[int]:
            return sorted(
                r.robot_id for r in self._active() if max(r.last_heard, r.registered_at) < since
            )

        away = silent()
        if away:
            log.info(
                "waiting up to %.0fs for robots %s, silent since the last round",
                timeout,
                away,
            )
        while away and time.monotonic() < end:
            self.poll(0.2)
            away = silent()
        if away:
            log.warning("robots %s silent since the last round; going on without them", away)
        return away

    def _active(self) -> list[RobotInfo]:
        return [r for r in self.robots.values() if not r.forgotten]

    def _forgotten_ids(self) -> set[int]:
        return {r.robot_id for r in self.robots.values() if r.forgotten} | self._forgotten_before

    def finish(self) -> None:
        """Tell every robot the run is over (waits briefly for the BYEs to go out)."""
        hs = [
            self.ep.send(
                MsgType.BYE, r.robot_id, self.keys[r.robot_id], self.session, 0, {}, timeout=5.0
            )
            for r in self.robots.values()
        ]
        for h in hs:  # each BYE's ARQ deadline is 5 s of the link's clock
            wait_on_clock(h, 6.0, self.clock)
