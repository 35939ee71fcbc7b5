"""The edge server's records: events, refused messages, the rounds log kept across a
restart, and the report's common part (see :class:`scaleflu.testbed.server.EdgeServer`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from scaleflu.fl.run import append_jsonl
from scaleflu.testbed.transport import (
    link_stats,
)

log = logging.getLogger(__name__)

OUTSIDER_LOG_LIMIT = 20  # rejections per (node outside the allow-list, reason) logged in full


class RecordsMixin:
    """Events, rejections and the report of an :class:`EdgeServer`."""

    def _reload_logs(self, last: int) -> None:
        """Rounds and rejections logged before a restart (the report covers the whole run)."""
        rows: dict[int, dict[str, Any]] = {}
        path = self.run_dir / "rounds.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the crash
                    continue
                if isinstance(row, dict) and int(row.get("round", 0)) <= last:
                    rows[int(row["round"])] = row
        self.rounds_log = [rows[t] for t in sorted(rows)]
        path = self.run_dir / "rejections.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    self.rejections.append({**json.loads(line), "before_restart": True})
                except json.JSONDecodeError:
                    continue

    def _event(self, kind: str, **data: Any) -> None:
        row = {"t": round(time.monotonic() - self.t0, 3), "event": kind, **data}
        self.events.append(row)
        if self.on_event is not None:
            self.on_event(kind, row)

    def _reject(
        self, reason: str, robot: int | None, what: str, detail: str = "", round_: int | None = None
    ) -> None:
        """Log and count a refused message.

        Messages from nodes outside the allow-list (a keyless flood) are logged and written
        ``OUTSIDER_LOG_LIMIT`` times per (node, reason); after that they are only counted
        (``rejections_counted_only`` in the report), so a flood fills neither log nor disk.
        """
        if robot not in self.keys:
            k = (robot, reason)
            n = self._outsider_rejects.get(k, 0) + 1
            self._outsider_rejects[k] = n
            if n > OUTSIDER_LOG_LIMIT:
                if n & (n - 1) == 0:  # powers of two: a trace that the flood goes on
                    log.warning("node %s: %d messages rejected (%s) so far", robot, n, reason)
                return
        row = {
            "t": round(time.monotonic() - self.t0, 3),
            "round": round_ if round_ is not None else (self.round.t if self.round else None),
            "robot": robot,
            "message": what,
            "reason": reason,
            "detail": detail[:200],
        }
        self.rejections.append(row)
        append_jsonl(self.run_dir / "rejections.jsonl", row)
        log.warning("rejected %s from robot %s: %s %s", what, robot, reason, detail)

    def _report_common(self, total_s: float) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for x in self.rejections:
            reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
        counted_only: dict[str, dict[str, int]] = {}  # node -> reason -> n (beyond the log)
        for (node, why), n in self._outsider_rejects.items():
            if n > OUTSIDER_LOG_LIMIT:
                reasons[why] = reasons.get(why, 0) + n - OUTSIDER_LOG_LIMIT
                counted_only.setdefault(str(node), {})[why] = n - OUTSIDER_LOG_LIMIT
        return {
            "total_s": total_s,
            "session": f"{self.session:08x}",
            "robots": {
                r.robot_id: {
                    "registrations": r.registrations,
                    "forgotten": r.forgotten,
                    "num_samples": r.num_samples,
                }
                for r in self.robots.values()
            },
            "rejections": self.rejections,
            "rejection_counts": reasons,
            "rejections_counted_only": counted_only,
            "events": self.events,
            "server_link": link_stats(self.link),
            "server_tx_bytes": self.ep.sent_bytes,
            "server_rx_bytes": self.bytes_rx,
            "air_bytes_total": self._air_bytes(),
            "unicast_fallbacks": self.unicast_fallbacks,
            "history_rounds": self.history.last_completed_round(),
            "poison": {
                "backdoor_clients": self.cfg.data.poison.backdoor_clients,
                "target_label": self.setup.poison.target_label,
            },
        }
