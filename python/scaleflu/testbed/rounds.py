"""The edge server's round scheduler: uploads of the open round, their checks, and round closing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaleflu.fl.aggregation import NoUpdateAcceptedError, norm, update_of
from scaleflu.fl.run import append_jsonl
from scaleflu.fl.strategy import RoundRejectedError, RoundResult, close_round
from scaleflu.testbed.common import arrays, cast_like, decode_state, tensors
from scaleflu.testbed.protocol import (
    MsgType,
    ProtocolError,
    client_of,
    robot_of,
    state_sha256,
    validate_update,
)
from scaleflu.testbed.sessions import RobotInfo
from scaleflu.testbed.transport import (
    link_counters,
    round_link_row,
)
from scaleflu.testbed.validation import UpdateMeta

log = logging.getLogger(__name__)


@dataclass
class RoundState:
    """The open round: scheduled robots and the uploads accepted so far."""

    t: int
    base: dict[str, torch.Tensor]  # Theta[t], the model the robots train from
    deadline: float
    scheduled: set[int] = field(default_factory=set)
    updates: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    refused: dict[int, float] = field(default_factory=dict)  # robot -> when its upload was refused

    def not_awaited(
        self,
        grace_s: float,
        receiving: Callable[[int], bool] = lambda r: False,
        now: float | None = None,
    ) -> set[int]:
        """Robots refused more than ``grace_s`` ago and not sending now (``receiving(r)``: an
        upload from r is arriving on the link): the round no longer waits for them. A resend
        under way is awaited, however slow the link (up to the round's deadline). ``now`` and
        the refusal times are on the server's clock (the link's, as the deadline; None:
        ``time.monotonic()``)."""
        now = time.monotonic() if now is None else now
        out = set()
        for r, at in self.refused.items():
            if now - at <= grace_s:
                continue
            if receiving(r):
                self.refused[r] = now  # its grace starts again when the transfer ends
                continue
            out.add(r)
        return out

    reported: dict[int, dict[str, Any]] = field(default_factory=dict)


class RoundsMixin:
    """Rounds of an :class:`EdgeServer`: schedule, collect, check, aggregate, record."""

    def _on_update(self, robot: RobotInfo, t: int, meta: Mapping[str, Any], body: bytes) -> None:
        r = robot.robot_id
        rs = self.round
        if t in self.closed_rounds and r in self.closed_rounds[t]:
            self._reject("duplicate", r, f"UPDATE r{t}", "round already closed with its update")
            self._notify_reject(r, t, "duplicate")
            return
        if rs is None or t != rs.t:
            self._reject("late" if rs is None or t < rs.t else "wrong_round", r, f"UPDATE r{t}")
            self._notify_reject(r, t, "late or wrong round")
            return
        if robot.forgotten:
            self._reject("forgotten", r, f"UPDATE r{t}")
            return
        if r not in rs.scheduled:
            self._reject("not_scheduled", r, f"UPDATE r{t}")
            return
        if r in rs.updates:
            self._reject("duplicate", r, f"UPDATE r{t}")
            self._notify_reject(r, t, "duplicate")
            return
        try:  # typed meta first: nothing is decoded or stored before it parses
            um = UpdateMeta.parse(meta)
        except ProtocolError as exc:
            self._refuse_update(rs, r, t, exc.reason, exc.detail)
            return
        base = arrays(rs.base)
        try:
            ref = base if um.delta else None
            state = decode_state(body, reference=ref)
            if ref is not None:  # a delta decodes in the reference's dtypes
                state = cast_like(state, base)
        except Exception as exc:
            self._refuse_update(rs, r, t, "malformed_tensors", repr(exc))
            return
        mn = self.tb.max_update_norm
        # dtypes are compared, not cast: a float64 upload of a float32 model is refused
        reason = validate_update(state, base, None if mn is None else float(mn))
        if reason is not None:
            self._refuse_update(rs, r, t, reason.split(":")[0], reason)
            return
        rs.updates[r] = tensors(state)
        rs.reported[r] = {"num_samples": um.num_samples, "train_s": um.train_s}
        robot.link_bytes_tx = um.link_bytes_tx
        log.info(
            "round %d: update from robot %d accepted (%d/%d)",
            t,
            r,
            len(rs.updates),
            len(rs.scheduled),
        )

    def _refuse_update(self, rs: RoundState, r: int, t: int, reason: str, detail: str) -> None:
        """Refuse a robot's upload of the open round; the round stops waiting for it."""
        rs.refused.setdefault(r, self.clock())
        self._reject(reason, r, f"UPDATE r{t}", detail, round_=t)
        self._notify_reject(r, t, f"{reason}: {detail}"[:200])

    def _notify_reject(self, r: int, t: int, reason: str) -> None:
        self.ep.send(
            MsgType.REJECT, r, self.keys[r], self.session, t, {"reason": reason}, timeout=10.0
        )

    def run_round(self, t: int) -> dict[str, Any] | None:
        """Round t: send, collect until all are in or the deadline, aggregate, record."""
        tb = self.tb
        w0 = time.perf_counter()
        bytes0 = self._air_bytes()
        link0 = link_counters(self.link)
        fallbacks0 = self.unicast_fallbacks
        rs = RoundState(t, self.global_state, self.clock() + float(tb.round_deadline_s))
        self.round = rs
        src = state_sha256(arrays(self.global_state))
        rs.scheduled.update(robot.robot_id for robot in self._active())
        self._send_model_many(self._active(), self.global_state, "train", t, src_sha=src)
        self._prev_broadcast = self.global_state
        self._event("round_start", round=t, scheduled=sorted(rs.scheduled))
        while self.clock() < rs.deadline:
            grace = float(tb.refused_grace_s)
            gone = rs.not_awaited(grace, self.link.receiving_from, self.clock())
            waiting = rs.scheduled - self._forgotten_ids() - gone
            if rs.scheduled and set(rs.updates) >= waiting:
                break
            self.poll(0.2)
            # robots that joined, re-registered or lost their model get it (again)
            for robot in self._active():
                busy = robot.robot_id in rs.updates or robot.robot_id in rs.refused
                if not busy and self._needs(robot, src):
                    rs.scheduled.add(robot.robot_id)
                    self._send_model(robot, self.global_state, "train", t, src_sha=src)
        self.round = None
        # a round that aggregates is closed to its robots; a failed attempt is retried with
        # the same robots (their second upload of round t is not a duplicate)
        missing = sorted(rs.scheduled - set(rs.updates) - self._forgotten_ids() - set(rs.refused))
        if missing:
            log.warning(
                "round %d closed with robots %s missing (deadline %.0fs)",
                t,
                missing,
                float(tb.round_deadline_s),
            )
            self._event("round_missing", round=t, robots=missing)
        if not rs.updates:
            log.warning("round %d: no update accepted", t)
            self._event("round_failed", round=t, reason="no valid update")
            return None
        # the robots' local models in robot order (the aggregate does not depend on arrival)
        replies = {client_of(r): rs.updates[r] for r in sorted(rs.updates)}
        try:
            res = self.strategy.aggregate_train(t, rs.base, replies)
        except (NoUpdateAcceptedError, RoundRejectedError) as exc:
            log.warning("round %d: %s", t, exc)
            self._event("round_failed", round=t, reason=str(exc)[:200])
            refused = exc.refused if isinstance(exc, NoUpdateAcceptedError) else {}
            for c, why in refused.items():
                self._refuse_update(rs, robot_of(c), t, why.split(":")[0], why)
            return None
        for c, why in res.refused.items():
            self._refuse_update(rs, robot_of(c), t, why.split(":")[0], why)
        self.closed_rounds[t] = set(rs.updates)
        metrics = self.strategy.evaluate(t, res.state)
        wall, _ = close_round(self.history, res, metrics, w0)
        self.global_state = res.state
        row = {
            "round": t,
            **metrics,
            "participants": [robot_of(c) for c in res.clients],
            "missing": missing,
            "rejected": sum(1 for x in self.rejections if x["round"] == t),
            "aggregation": self.agg_cfg.strategy,
            "update_norms": {robot_of(c): round(v, 6) for c, v in res.norms.items()},
            "air_bytes": self._air_bytes() - bytes0,
            "aoi_s": self.aoi_seconds(),
            "wall_s": wall,
            "train_s": {r: m.get("train_s") for r, m in rs.reported.items()},
        }
        row["link"] = round_link_row(link0, link_counters(self.link), row["air_bytes"])
        if hasattr(self.link, "broadcast"):  # a MAC link: model sends moved off the broadcast
            row["link"]["unicast_fallbacks"] = self.unicast_fallbacks - fallbacks0
        self.rounds_log.append(row)
        append_jsonl(self.run_dir / "rounds.jsonl", row)
        self._event("round_end", **{k: row[k] for k in ("round", "test_acc", "participants")})
        log.info(
            "round %d done: acc %.3f, robots %s, %.1fs",
            t,
            metrics["test_acc"],
            row["participants"],
            wall,
        )
        return row

    def norm_prior(
        self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]
    ) -> list[float]:
        """Trusted update norms for the norm bound's floor in a round with few updates.

        The norms accepted in the last ``aggregation.norm_history`` completed rounds; without
        any (round 1, or only failed rounds), the norm of the server's reference update
        (:meth:`reference_norm`) with the SGD steps of the largest of ``clients`` (the round's
        uploads). Empty when the round has ``small_round`` updates or more.
        """
        cfg = self.agg_cfg
        robots = [robot_of(c) for c in clients]
        if cfg.norm_factor is None or len(robots) >= int(cfg.small_round):
            return []
        hist: list[float] = []
        rows = self.rounds_log[-int(cfg.norm_history) :] if int(cfg.norm_history) else []
        for row in rows:
            norms = row.get("update_norms") or {}
            for r in row.get("participants") or []:
                v = norms.get(r, norms.get(str(r)))  # int keys in memory, str after a restart
                if isinstance(v, (int, float)):
                    hist.append(float(v))
        if hist:
            return hist
        if int(cfg.reference_samples) > 0 and robots:
            size = max(self.setup.data_sizes[client_of(r)] for r in robots)
            return [self.reference_norm(t, size)]
        return []

    def reference_norm(self, t: int, size: int) -> float:
        """Norm of the server's own update of round t: the global model trained with the robots'
        local settings on the server's validation slice of the test split
        (``aggregation.reference_samples``, seeded), cycled to ``size`` samples (a robot's data
        size, known to the server, not claimed by the robot) so it takes as many SGD steps as
        that robot. Cached per (round, size)."""
        cache = self._ref_norms
        if (t, size) in cache:
            return cache[(t, size)]
        from scaleflu.fl.fedavg import LocalConfig, derive_seed, train_client

        seed = int(self.cfg.seed)
        test = self.setup.test
        rng = np.random.default_rng(derive_seed(seed, 91))
        n_val = max(1, min(int(self.agg_cfg.reference_samples), len(test)))
        val = rng.permutation(len(test))[:n_val]
        local = LocalConfig.from_config(self.cfg.fl)
        w0 = time.perf_counter()
        state = train_client(
            self.setup.new_model(), self.global_state, np.resize(val, max(size, 1)), test, local,
            seed, t, 1 << 20,
        )  # fmt: skip
        value = norm(update_of(state, self.global_state))
        cache[(t, size)] = value
        self._event("reference_norm", round=t, samples=size, norm=round(value, 6))
        log.info(
            "round %d: reference update norm %.4g (%d samples, %.1fs)",
            t,
            value,
            size,
            time.perf_counter() - w0,
        )
        return value

    def record_failed_round(self, t: int, failures: int) -> dict[str, Any]:
        """Record round t as failed: no participant, Theta[t+1] = Theta[t] (issue 13, item 6).

        Called after ``max_round_retries`` retries of a round without a valid update. The
        history keeps its round numbering (the round's broadcast is charged to the link, no
        upload), ``rounds.jsonl`` gets a row with ``failed: true`` and the run goes on with
        round t + 1: one robot or one outsider cannot end the federation.
        """
        w0 = time.perf_counter()
        reasons = [e.get("reason") for e in self.events if e["event"] == "round_failed"]
        unchanged = RoundResult.unchanged(t, self.global_state)
        metrics = self.strategy.evaluate(t, unchanged.state)
        wall, _ = close_round(self.history, unchanged, metrics, w0)
        counters = link_counters(self.link)
        row = {
            "round": t,
            **metrics,
            "failed": True,
            "failures": failures,
            "reason": reasons[-1] if reasons else None,
            "participants": [],
            "missing": [],
            "rejected": sum(1 for x in self.rejections if x["round"] == t),
            "aggregation": self.agg_cfg.strategy,
            "update_norms": {},
            "air_bytes": 0,
            "aoi_s": self.aoi_seconds(),
            "wall_s": wall,
            "train_s": {},
            "link": round_link_row(counters, counters, 0),
        }
        self.rounds_log.append(row)
        append_jsonl(self.run_dir / "rounds.jsonl", row)
        self._event("round_skipped", round=t, failures=failures, reason=row["reason"])
        log.error(
            "round %d failed %d times (%s): recorded with no participant, model unchanged; "
            "the federation goes on with round %d",
            t,
            failures,
            row["reason"],
            t + 1,
        )
        return row
