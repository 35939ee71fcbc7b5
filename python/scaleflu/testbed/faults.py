"""A robot that misbehaves on purpose, for tests and demos of the server's defences.

:class:`RobotFaults` is a hook object the robot (:class:`~scaleflu.testbed.robot.RobotClient`)
consults at four points of its round ``fault_round``; every other round, and a robot without
faults (:data:`NO_FAULTS`), passes through them unchanged:

* :meth:`~RobotFaults.before_training`: ``crash`` (the process exits after receiving the
  model, before uploading);
* :meth:`~RobotFaults.replace_upload`: ``scaled`` (the real upload becomes global + 100 x
  (local - global): model poisoning) and ``free_ride`` (the model it was sent, untouched);
* :meth:`~RobotFaults.before_upload`: ``nan`` and ``shape`` (a NaN / wrong-shape upload before
  the real one), ``bad_meta`` (``"x"`` where an int belongs) and ``float64`` (the model in
  float64), each sent and settled before the real upload;
* :meth:`~RobotFaults.after_upload`: ``duplicate`` and ``replay`` (the real upload sent again,
  re-sealed / byte-identical), ``forged`` (an upload claiming to be another robot, sealed with
  this robot's key) and ``garbage`` (random bytes).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from scaleflu.testbed.common import encode_state, wait_on_clock
from scaleflu.testbed.protocol import SERVER_ID, Envelope, MsgType, seal

log = logging.getLogger(__name__)

FAULTS = (
    "nan",
    "shape",
    "duplicate",
    "replay",
    "forged",
    "garbage",
    "crash",
    "bad_meta",
    "float64",
    "scaled",
    "free_ride",
)

Arrays = dict[str, np.ndarray]


class RobotFaults:
    """The faults ``kinds`` in round ``fault_round``; ``forge_as``: the robot a ``forged``
    upload claims to be (None: the next robot id of three)."""

    def __init__(
        self, kinds: tuple[str, ...] = (), fault_round: int = 1, forge_as: int | None = None
    ) -> None:
        bad = [f for f in kinds if f not in FAULTS]
        if bad:
            raise ValueError(f"unknown faults {bad}; choose from {', '.join(FAULTS)}")
        self.kinds = tuple(kinds)
        self.fault_round = int(fault_round)
        self.forge_as = forge_as

    def _now(self, t: int, *kinds: str) -> list[str]:
        """Which of ``kinds`` strike in round ``t``."""
        return [k for k in kinds if k in self.kinds] if t == self.fault_round else []

    def before_training(self, robot: Any, t: int) -> None:
        """``crash``: the process exits (status 3) with the model of round ``t`` received."""
        if not self._now(t, "crash"):
            return
        log.warning("robot %d: fault 'crash': exiting in round %d", robot.robot_id, t)
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except (OSError, ValueError):  # a closed stream must not stop the exit
                pass
        os._exit(3)

    def replace_upload(self, t: int, local: Arrays, received: Mapping[str, np.ndarray]) -> Arrays:
        """The upload in place of the trained ``local`` (``received``: the model it was sent)."""
        for kind in self._now(t, "scaled", "free_ride"):
            if kind == "scaled":
                local = {
                    k: (received[k] + 100.0 * (v - received[k])).astype(v.dtype)
                    if v.dtype.kind == "f"
                    else v
                    for k, v in local.items()
                }
            else:
                local = {k: v.copy() for k, v in received.items()}
        return local

    def before_upload(
        self, robot: Any, t: int, local: Arrays, meta: dict[str, Any], timeout: float
    ) -> None:
        """Bad uploads sent (and settled) before the real one."""
        bad: list[tuple[dict[str, Any], Arrays]] = []
        for kind in self._now(t, "nan", "bad_meta", "float64", "shape"):
            if kind == "nan":
                nan = {k: v.copy() for k, v in local.items()}
                first = next(k for k, v in nan.items() if v.dtype.kind == "f")
                nan[first].reshape(-1)[0] = np.nan
                bad.append((meta, nan))
            elif kind == "bad_meta":
                bad.append(({**meta, "num_samples": "x"}, local))
            elif kind == "float64":
                bad.append(({**meta}, {k: _wide(v) for k, v in local.items()}))
            else:
                wrong = {k: v.copy() for k, v in local.items()}
                first = next(iter(wrong))
                wrong[first] = np.zeros((*wrong[first].shape, 2), dtype=wrong[first].dtype)
                bad.append((meta, wrong))
        for m, state in bad:
            body = encode_state(state)
            s = robot.session or 0
            h = robot.ep.send(MsgType.UPDATE, SERVER_ID, robot.key, s, t, m, body, timeout=timeout)
            wait_on_clock(h, timeout, robot.clock)

    def after_upload(
        self,
        robot: Any,
        t: int,
        meta: dict[str, Any],
        body: bytes,
        sealed: bytes,
        timeout: float,
    ) -> None:
        """The real upload again (re-sealed, replayed), forged as another robot, or garbage."""
        s = robot.session or 0
        hs = []
        for kind in self._now(t, "duplicate", "replay", "forged", "garbage"):
            if kind == "duplicate":
                env = (MsgType.UPDATE, SERVER_ID, robot.key, s, t, meta, body)
                hs.append(robot.ep.send(*env, timeout=timeout))
            elif kind == "replay":
                hs.append(robot.ep.send_raw(SERVER_ID, sealed, timeout))
            elif kind == "forged":
                victim = self.forge_as or (robot.robot_id % 3) + 1
                forged = self._forge(robot, victim, t, meta, body)
                hs.append(robot.ep.send_raw(SERVER_ID, forged, timeout))
            else:
                hs.append(robot.ep.send_raw(SERVER_ID, secrets.token_bytes(300), timeout))
        for h in hs:
            wait_on_clock(h, timeout, robot.clock)

    @staticmethod
    def _forge(robot: Any, victim: int, t: int, meta: dict[str, Any], body: bytes) -> bytes:
        """An UPDATE that claims to come from ``victim`` but is sealed with the robot's key."""
        counter = robot.ep.counter.next()
        env = Envelope(
            MsgType.UPDATE, robot.session or 0, t, victim, SERVER_ID, counter, meta, body
        )
        return seal(env, robot.key)


def _wide(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float64) if v.dtype.kind == "f" else v


NO_FAULTS = RobotFaults()
