"""Per-robot budget of the server's airtime that a robot's own requests may draw.

On one frequency every byte the server sends is airtime taken from every robot. The server's
own schedule (each round's model, the deployments) is its plan; but a robot's requests make it
send too: a RESYNC asks for a full model, a REGISTER for a REGISTER_ACK (a session-0 one for a
SERVER_HELLO), an UNLEARN_REQUEST for an UNLEARN_ACK, an upload the server refuses for a REJECT.
:class:`Airtime` charges every such answer to the robot that asked, at its size in bytes, against
one token bucket per robot: it holds ``budget`` bytes and refills at ``budget`` per
``window_s`` seconds of the link's clock. An answer that does not fit is not sent: the request
is refused as ``throttled`` (counted per robot in the report). So what a robot can make the
server send in any ``window_s`` is at most ``2 x budget`` (a full bucket, then its refill),
whatever it sends; a registration inside a session is answered with a REGISTER_ACK only
(what the robot holds stays known, so the next model is a delta), never with a full model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

CONTROL_BYTES = 64 * 1024  # budget for answers besides full models (null testbed.airtime.bytes)
FULL_MODELS = 2  # full models per window in that default


@dataclass
class _Bucket:
    tokens: float
    at: float
    charged: int = 0
    throttled: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class Airtime:
    """Token buckets of server airtime (bytes), one per robot (see the module docstring).

    ``budget``: bytes a robot may draw per ``window_s``; ``clock``: the link's (the shared
    medium's virtual time on ofdm-shared, where airtime is measured).
    """

    def __init__(
        self,
        budget: int,
        window_s: float,
        clock: Callable[[], float],
        on_throttle: Callable[[int, str, int], None] | None = None,
    ) -> None:
        if budget < 1 or window_s <= 0:
            raise ValueError("testbed.airtime: bytes must be >= 1 and window_s > 0")
        self.budget = int(budget)
        self.window_s = float(window_s)
        self.clock = clock
        self.on_throttle = on_throttle  # (robot, request, count): at counts 1, 2, 4, 8, ...
        self._buckets: dict[int, _Bucket] = {}

    @classmethod
    def from_config(
        cls,
        airtime: Mapping[str, Any],
        full_model_bytes: int,
        clock: Callable[[], float],
        on_throttle: Callable[[int, str, int], None] | None = None,
    ) -> Airtime:
        """The budget of ``testbed.airtime`` (``bytes`` null: 2 full models + 64 KiB)."""
        raw = airtime.get("bytes")
        window = float(airtime.get("window_s", 60.0))
        budget = int(raw) if raw is not None else FULL_MODELS * full_model_bytes + CONTROL_BYTES
        return cls(budget, window, clock, on_throttle)

    def _bucket(self, robot: int) -> _Bucket:
        now = self.clock()
        b = self._buckets.get(robot)
        if b is None:
            b = self._buckets[robot] = _Bucket(float(self.budget), now)
        elif now > b.at:
            b.tokens = min(
                float(self.budget), b.tokens + (now - b.at) * self.budget / self.window_s
            )
            b.at = now
        return b

    def charge(self, robot: int, nbytes: int, what: str) -> bool:
        """Take ``nbytes`` of robot's budget for an answer to its request ``what``; False (and
        counted) when they do not fit: the answer must not be sent."""
        b = self._bucket(robot)
        if nbytes > b.tokens:
            b.throttled += 1
            b.reasons[what] = b.reasons.get(what, 0) + 1
            if b.throttled & (b.throttled - 1) == 0:  # powers of two: a trace, not a flood
                log.warning(
                    "robot %d: %s throttled (%d B, %.0f B of its airtime left; %d so far)",
                    robot,
                    what,
                    nbytes,
                    b.tokens,
                    b.throttled,
                )
                if self.on_throttle is not None:
                    self.on_throttle(robot, what, b.throttled)
            return False
        b.tokens -= nbytes
        b.charged += nbytes
        return True

    def throttled(self, robot: int) -> int:
        """How many of robot's requests were refused for want of airtime."""
        b = self._buckets.get(robot)
        return b.throttled if b is not None else 0

    def report(self) -> dict[str, object]:
        """The budget and, per robot, bytes charged and requests throttled (by kind)."""
        return {
            "bytes_per_window": self.budget,
            "window_s": self.window_s,
            "robots": {
                r: {"charged_bytes": b.charged, "throttled": b.throttled, "by_request": b.reasons}
                for r, b in sorted(self._buckets.items())
            },
        }
