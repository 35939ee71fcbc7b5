"""The edge server's records: its events and the messages it refused (kept across a restart).

Every part of the server (:class:`scaleflu.testbed.server.EdgeServer`) writes here: an event
(``register``, ``round_end``, ``unlearn_done``, ...) is a row with the seconds since the server
started; a refused message is a row of ``rejections.jsonl`` with its reason.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from scaleflu.fl.run import append_jsonl

log = logging.getLogger(__name__)

OUTSIDER_LOG_LIMIT = 20  # rejections per (node outside the allow-list, reason) logged in full

EventHook = Callable[[str, dict[str, Any]], None]


class Records:
    """Events and rejections of one server run.

    ``allowed``: the robot ids of the allow-list (messages from any other node are counted,
    not logged without end); ``t0``: the server's start (``time.monotonic``); ``on_event``:
    called with each event; ``current_round``: the open round, for rejections that name none.
    """

    def __init__(
        self,
        run_dir: Path,
        allowed: Container[int],
        t0: float,
        on_event: EventHook | None = None,
        current_round: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.allowed = allowed
        self.t0 = t0
        self.on_event = on_event
        self.current_round = current_round
        self.events: list[dict[str, Any]] = []
        self.rejections: list[dict[str, Any]] = []
        self._outsider_rejects: dict[tuple[int | None, str], int] = {}  # (node, reason) -> n

    def elapsed(self) -> float:
        """Seconds since the server started (3 decimals, as every row records them)."""
        return round(time.monotonic() - self.t0, 3)

    def reload(self) -> None:
        """The rejections logged before a restart (the report covers the whole run)."""
        path = self.run_dir / "rejections.jsonl"
        if not path.is_file():
            return
        for line in path.read_text().splitlines():
            try:
                self.rejections.append({**json.loads(line), "before_restart": True})
            except json.JSONDecodeError:  # a line cut by the crash
                continue

    def event(self, kind: str, **data: Any) -> None:
        """Record an event (and pass it to ``on_event``)."""
        row = {"t": self.elapsed(), "event": kind, **data}
        self.events.append(row)
        if self.on_event is not None:
            self.on_event(kind, row)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind, in order."""
        return [e for e in self.events if e["event"] == kind]

    def reject(
        self, reason: str, robot: int | None, what: str, detail: str = "", round_: int | None = None
    ) -> None:
        """Log and count a refused message.

        Messages from nodes outside the allow-list (a keyless flood) are logged and written
        ``OUTSIDER_LOG_LIMIT`` times per (node, reason); after that they are only counted
        (``rejections_counted_only`` in the report), so a flood fills neither log nor disk.
        """
        if robot not in self.allowed:
            k = (robot, reason)
            n = self._outsider_rejects.get(k, 0) + 1
            self._outsider_rejects[k] = n
            if n > OUTSIDER_LOG_LIMIT:
                if n & (n - 1) == 0:  # powers of two: a trace that the flood goes on
                    log.warning("node %s: %d messages rejected (%s) so far", robot, n, reason)
                return
        row = {
            "t": self.elapsed(),
            "round": round_ if round_ is not None else self.current_round(),
            "robot": robot,
            "message": what,
            "reason": reason,
            "detail": detail[:200],
        }
        self.rejections.append(row)
        append_jsonl(self.run_dir / "rejections.jsonl", row)
        log.warning("rejected %s from robot %s: %s %s", what, robot, reason, detail)

    def rejected_in(self, t: int) -> int:
        """How many messages of round ``t`` were refused."""
        return sum(1 for x in self.rejections if x["round"] == t)

    def report(self) -> dict[str, Any]:
        """The report's record of refused messages and events."""
        reasons: dict[str, int] = {}
        for x in self.rejections:
            reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
        counted_only: dict[str, dict[str, int]] = {}  # node -> reason -> n (beyond the log)
        for (node, why), n in self._outsider_rejects.items():
            if n > OUTSIDER_LOG_LIMIT:
                reasons[why] = reasons.get(why, 0) + n - OUTSIDER_LOG_LIMIT
                counted_only.setdefault(str(node), {})[why] = n - OUTSIDER_LOG_LIMIT
        return {
            "rejections": self.rejections,
            "rejection_counts": reasons,
            "rejections_counted_only": counted_only,
            "events": self.events,
        }
