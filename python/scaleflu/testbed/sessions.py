"""Robot sessions of the edge server: the allow-list, the session challenge, registration, who
is active, and the one way the server's parts send to a robot (:meth:`Sessions.send`)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scaleflu.keys import public_bytes
from scaleflu.link import Link
from scaleflu.link.arq import SendHandle
from scaleflu.link.mcs import MCS_TABLE_VERSION
from scaleflu.testbed.airtime import Airtime
from scaleflu.testbed.common import Endpoint, LinkDeadline, install_link_keys, wait_on_clock
from scaleflu.testbed.keys import check_robot_key, sign
from scaleflu.testbed.protocol import SERVER_ID, MsgType, ProtocolError, client_of
from scaleflu.testbed.records import Records
from scaleflu.testbed.validation import RegisterMeta

log = logging.getLogger(__name__)


@dataclass
class RobotInfo:
    """What the server knows about one registered robot."""

    robot_id: int
    num_samples: int = 0
    registered_at: float = 0.0
    registrations: int = 0
    forgotten: bool = False
    link_bytes_tx: int = 0  # the robot's own ARQ byte counter, as it last reported it
    last_nonce: str | None = None  # nonce of its last REGISTER (a retry is not a new one)
    last_heard: float = 0.0  # the server's clock (the link's) at its last authenticated message


class Sessions:
    """The robots of one server run and the server's identity towards them.

    Owns the allow-list ``keys`` (robot id -> K_r), this start's ``session`` (the challenge a
    REGISTER must carry), the server's Ed25519 ``signing_key``, the registered robots and which
    of them asked to be forgotten. ``clock``: the link's; ``poll``: the server's message loop
    (the waits handle messages); ``next_round``: the round a registering robot joins;
    ``data_sizes``: the partition sizes the robots' claims are checked against;
    ``require_auth``: the link drops every frame of a node without a link key; ``airtime``:
    the per-robot budget every answer to a robot's request is charged to (:meth:`answer`).
    """

    def __init__(
        self,
        link: Link,
        keys: Mapping[int, bytes],
        signing_key: Ed25519PrivateKey,
        records: Records,
        clock: Callable[[], float],
        poll: Callable[[float], None],
        next_round: Callable[[], int],
        data_sizes: Mapping[int, int],
        require_auth: bool = True,
        airtime: Airtime | None = None,
    ) -> None:
        # a weak key (all bytes equal, a pattern, < 32 bytes) is refused with the fix
        self.keys = {r: check_robot_key(r, k) for r, k in keys.items()}
        self.signing_key = signing_key
        self.public_key = public_bytes(signing_key)
        self.records = records
        self.clock = clock
        self.poll = poll
        self.next_round = next_round
        self.data_sizes = data_sizes
        self.ep = Endpoint(link, SERVER_ID)
        install_link_keys(link, self.keys, SERVER_ID, require_auth)
        self.session = secrets.randbits(32) | 1
        self.airtime = airtime
        self.robots: dict[int, RobotInfo] = {}
        self._forgotten_before: set[int] = set()  # client requests accepted before a restart
        self._mcs_refused: dict[int, str] = {}  # robot -> nonce of its refused REGISTER (logged)

    # -- talking to robots ----------------------------------------------------------------

    def send(
        self,
        mtype: MsgType,
        robot: int,
        round_: int = 0,
        meta: dict[str, Any] | None = None,
        body: bytes = b"",
        timeout: float = 30.0,
    ) -> SendHandle:
        """Seal one envelope for ``robot`` (its key, this session) and start sending it."""
        key = self.keys[robot]
        return self.ep.send(mtype, robot, key, self.session, round_, meta, body, timeout=timeout)

    def answer(
        self,
        mtype: MsgType,
        robot: int,
        request: str,
        round_: int = 0,
        meta: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> SendHandle | None:
        """Seal and send an answer to robot's ``request``, charged to its airtime budget.

        None when the budget has no room for it (the answer is not sent; counted as
        ``throttled`` in the budget's report).
        """
        key = self.keys[robot]
        data = self.ep.build(mtype, robot, key, self.session, round_, meta)
        if self.airtime is not None and not self.airtime.charge(robot, len(data), request):
            return None
        return self.ep.send_raw(robot, data, timeout)

    def charge(self, robot: int, nbytes: int, request: str) -> None:
        """Charge robot's airtime budget ``nbytes`` for what its ``request`` makes the server
        send (a RESYNC: a full model); ProtocolError ``throttled`` when it has no room."""
        if self.airtime is not None and not self.airtime.charge(robot, nbytes, request):
            raise ProtocolError("throttled", f"{request}: no airtime left in this window")

    def sign(self, kind: str, robot: int, **fields: Any) -> str:
        """The server's signature of a ``kind`` statement to ``robot`` in this session."""
        return sign(self.signing_key, kind, session=self.session, robot=robot, **fields)

    def hello(self, robot: int) -> None:
        """Answer a session-0 REGISTER with this server's challenge (its session)."""
        if self.answer(MsgType.SERVER_HELLO, robot, "REGISTER", timeout=5.0) is None:
            raise ProtocolError("throttled", "challenge request: no airtime left in this window")

    def announce(self) -> None:
        """Tell every robot in the key file the (new) session, so restarted robots re-register."""
        for r in self.keys:
            self.send(MsgType.SERVER_HELLO, r, timeout=5.0)

    def finish(self) -> None:
        """Tell every robot the run is over (waits briefly for the BYEs to go out)."""
        hs = [self.send(MsgType.BYE, r, timeout=5.0) for r in self.robots]
        for h in hs:  # each BYE's ARQ deadline is 5 s of the link's clock
            wait_on_clock(h, 6.0, self.clock)

    # -- registration ---------------------------------------------------------------------

    def register(self, r: int, meta: Mapping[str, Any], holds: str | None = None) -> bool:
        """Handle a REGISTER of robot ``r``; True when it registers anew, False for a retry of
        the last one (acknowledged again).

        ``holds``: the SHA-256 of the model the server knows robot ``r`` holds (None: none). A
        registration within the session keeps it: the REGISTER_ACK names it, and a robot that
        no longer holds it (a restarted process) asks for a full model with a RESYNC, which is
        charged to its airtime budget. A registration itself never makes the server send a
        model. ProtocolError ``throttled`` when robot's budget has no room for the ACK (nothing
        registered then).
        """
        rm = RegisterMeta.parse(meta)
        nonce, num = rm.nonce, rm.num_samples
        if rm.mcs_table != MCS_TABLE_VERSION:
            # both ends must read the MCS in GRANTs and SIGNAL fields alike: refused, one line
            theirs = "none (older software)" if rm.mcs_table is None else rm.mcs_table
            reason = (
                f"MCS table version mismatch: robot {r} has {theirs}, "
                f"the server has {MCS_TABLE_VERSION}; update one of them"
            )
            if self._mcs_refused.get(r) != nonce:
                self._mcs_refused[r] = nonce
                log.error("robot %d refused: %s", r, reason)
                self.records.event("register_refused", robot=r, reason=reason)
            refusal = {
                "nonce": nonce,
                "accepted": False,
                "reason": reason,
                "mcs_table": MCS_TABLE_VERSION,
                "sig": self.sign("register_ack", r, nonce=nonce),
            }
            # charged to the robot's airtime like every answer: a storm of refused REGISTERs
            # draws no more than its budget
            if self.answer(MsgType.REGISTER_ACK, r, "REGISTER", 0, refusal, timeout=20.0) is None:
                raise ProtocolError("throttled", "REGISTER: no airtime left in this window")
            return False
        info = self.robots.get(r) or RobotInfo(r)
        if info.last_nonce == nonce:  # the same REGISTER again (retry): acknowledge, keep state
            self._send_register_ack(info, nonce, holds)
            return False
        if r in self._forgotten_before:
            info.forgotten = True  # registered to evaluate the unlearned model, not to train
        self._send_register_ack(info, nonce, holds)  # throttled: nothing below happens
        info.last_nonce = nonce
        info.num_samples = num
        info.registered_at = self.clock()  # the link's clock, as last_heard and round starts
        info.last_heard = info.registered_at
        info.registrations += 1
        self.robots[r] = info
        expected = self.data_sizes[client_of(r)]
        if num != expected:
            log.warning("robot %d reports %d samples, the partition has %d", r, num, expected)
        self.records.event("register", robot=r, registrations=info.registrations)
        log.info("robot %d registered (%d samples, registration %d)", r, num, info.registrations)
        return True

    def _send_register_ack(self, info: RobotInfo, nonce: str, holds: str | None) -> None:
        r = info.robot_id
        reply = {
            "nonce": nonce,
            "accepted": True,
            "reason": "forgotten: no training" if info.forgotten else "",
            "next_round": self.next_round(),
            "mcs_table": MCS_TABLE_VERSION,
            "holds": holds,
        }
        reply["sig"] = self.sign("register_ack", r, nonce=nonce)
        if self.answer(MsgType.REGISTER_ACK, r, "REGISTER", 0, reply, timeout=20.0) is None:
            raise ProtocolError("throttled", "REGISTER: no airtime left in this window")

    def heard(self, r: int) -> RobotInfo | None:
        """The registered robot ``r``, now heard from (None: not registered)."""
        robot = self.robots.get(r)
        if robot is not None:
            robot.last_heard = self.clock()
        return robot

    # -- who takes part -------------------------------------------------------------------

    def active(self) -> list[RobotInfo]:
        """The registered robots that were not forgotten."""
        return [r for r in self.robots.values() if not r.forgotten]

    def forgotten_ids(self) -> set[int]:
        """Robots that asked to be forgotten (this run or before its restart)."""
        return {r.robot_id for r in self.robots.values() if r.forgotten} | self._forgotten_before

    def forget(self, r: int, before_restart: bool = False) -> None:
        """Robot ``r`` leaves the federation: it takes part in no further round."""
        if before_restart:
            self._forgotten_before.add(r)
        robot = self.robots.get(r)
        if robot is not None:
            robot.forgotten = True

    def wait_for_robots(self, n: int, timeout: float) -> bool:
        """Handle messages until ``n`` robots are registered (and not forgotten) or timeout."""
        n = min(n, len(self.keys) - len(self.forgotten_ids()))
        end = LinkDeadline(timeout, self.clock)  # robots register over the link: its clock
        while not end.expired():
            if len(self.active()) >= n:
                return True
            self.poll(0.2)
        return len(self.active()) >= n

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
                r.robot_id for r in self.active() if max(r.last_heard, r.registered_at) < since
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

    def report(self) -> dict[int, dict[str, Any]]:
        """Per robot: registrations, forgotten, the data size it reported."""
        return {
            r.robot_id: {
                "registrations": r.registrations,
                "forgotten": r.forgotten,
                "num_samples": r.num_samples,
            }
            for r in self.robots.values()
        }
