"""The edge server's round scheduler: uploads of the open round, their checks, and round closing.

A round over the link is the one FedAvg round of :mod:`scaleflu.fl.strategy`, delivered by
radio: every active robot is sent Theta[t] (:class:`~scaleflu.testbed.downlink.Downlink`),
its upload is decoded once into tensors and checked on arrival (:meth:`Rounds.on_update`),
and when all are in or the deadline passes the strategy screens and aggregates them, the
server evaluates the new model and the round is recorded in the history store. A robot's
local model is aggregated in robot order, whatever the order of arrival.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaleflu.fl.aggregation import AggregationConfig, NoUpdateAcceptedError, norm, update_of
from scaleflu.fl.fedavg import LocalConfig, train_client
from scaleflu.fl.run import append_jsonl
from scaleflu.fl.strategy import (
    CandidateRejection,
    FedAvg,
    RoundRejectedError,
    RoundResult,
    close_round,
    validation_indices,
)
from scaleflu.link import Link
from scaleflu.testbed.common import arrays, cast_like, decode_state, tensors
from scaleflu.testbed.downlink import Downlink
from scaleflu.testbed.protocol import (
    MsgType,
    ProtocolError,
    client_of,
    robot_of,
    state_sha256,
    validate_update,
)
from scaleflu.testbed.records import Records
from scaleflu.testbed.sessions import RobotInfo, Sessions
from scaleflu.testbed.transport import (
    link_adaptation,
    link_counters,
    round_adaptation,
    round_link_row,
)
from scaleflu.testbed.validation import UpdateMeta

log = logging.getLogger(__name__)

PROGRESS_S = 5.0  # wall seconds between the progress lines of a round in progress

State = dict[str, torch.Tensor]


@dataclass
class RoundState:
    """The open round: scheduled robots and the uploads accepted so far."""

    t: int
    base: State  # Theta[t], the model the robots train from
    deadline: float
    scheduled: set[int] = field(default_factory=set)
    updates: dict[int, State] = field(default_factory=dict)
    refused: dict[int, float] = field(default_factory=dict)  # robot -> when its upload was refused
    reported: dict[int, dict[str, Any]] = field(default_factory=dict)

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


class TrustedNorms:
    """The edge server's trusted update norms: the norm bound's floor in a round with few
    updates (the strategy's ``norm_prior``).

    The norms it accepted in the last ``norm_history`` rounds that had ``small_round`` updates
    or more (:meth:`record`: there the round's median, an honest majority's, bounded them);
    without any, the norm of its own reference update (:meth:`reference_norm`) with the SGD
    steps of the round's largest robot. The norms accepted in small rounds are never trusted:
    with two robots the bound of each round would follow the norms the previous rounds let
    through, and a robot growing its update a little every round walks it up (0.001, 18, 28,
    36, 61 in an attack on the testbed). ``setup``: the run's data (the test split's validation
    samples, the partition sizes); ``cfg``: the run's config (seed, local settings).
    """

    def __init__(self, cfg: AggregationConfig, setup: Any, run_cfg: Any, records: Records) -> None:
        self.cfg = cfg
        self.setup = setup
        self.run_cfg = run_cfg
        self.records = records
        self.rounds: list[list[float]] = []  # per completed round: its accepted norms
        self._ref_norms: dict[tuple[int, int], float] = {}  # (round, size) -> reference norm
        self._ref_update: tuple[tuple[int, int], dict[str, torch.Tensor]] | None = None

    def record(self, row: Mapping[str, Any]) -> None:
        """Keep the accepted norms of a round's row (``participants``, ``update_norms``: robot
        ids as ints in memory, as strings after a restart) when the round had ``small_round``
        updates or more (``update_norms`` has every screened update's norm)."""
        norms = row.get("update_norms") or {}
        kept = []
        if len(norms) >= int(self.cfg.small_round):
            for r in row.get("participants") or []:
                v = norms.get(r, norms.get(str(r)))
                if isinstance(v, (int, float)):
                    kept.append(float(v))
        self.rounds.append(kept)

    def __call__(self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]) -> list[float]:
        """Trusted norms for round ``t``'s uploads of ``clients`` (empty with ``small_round``
        updates or more)."""
        cfg = self.cfg
        if cfg.norm_factor is None or len(clients) >= int(cfg.small_round):
            return []
        recent = self.rounds[-int(cfg.norm_history) :] if int(cfg.norm_history) else []
        hist = [v for kept in recent for v in kept]
        if hist:
            return hist
        if int(cfg.reference_samples) > 0 and clients:
            size = max(self.setup.data_sizes[n] for n in clients)
            return [self.reference_norm(t, base, size)]
        return []

    def reference_update(
        self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]
    ) -> dict[str, torch.Tensor] | None:
        """The server's own update of round t (:meth:`reference_norm`) for the direction test
        of a round with fewer than ``small_round`` updates (the strategy's ``reference``);
        None for larger rounds, without ``min_cosine`` or ``reference_samples``."""
        cfg = self.cfg
        if cfg.min_cosine is None or int(cfg.reference_samples) <= 0 or not clients:
            return None
        if len(clients) >= int(cfg.small_round):
            return None
        size = max(self.setup.data_sizes[n] for n in clients)
        self.reference_norm(t, base, size)
        assert self._ref_update is not None and self._ref_update[0] == (t, size)
        return self._ref_update[1]

    def reference_norm(self, t: int, base: Mapping[str, torch.Tensor], size: int) -> float:
        """Norm of the server's own update of round t: ``base`` trained with the robots' local
        settings on the server's validation slice of the test split
        (``aggregation.reference_samples``, seeded), cycled to ``size`` samples (a robot's data
        size, known to the server, not claimed by the robot) so it takes as many SGD steps as
        that robot. Cached per (round, size); the update itself for the latest of them."""
        cache = self._ref_norms
        if (t, size) in cache and self._ref_update is not None:
            if self._ref_update[0] == (t, size):
                return cache[(t, size)]
        seed = int(self.run_cfg.seed)
        test = self.setup.test
        val = validation_indices(seed, len(test), int(self.cfg.reference_samples))
        local = LocalConfig.from_config(self.run_cfg.fl)
        w0 = time.perf_counter()
        state = train_client(
            self.setup.new_model(), base, np.resize(val, max(size, 1)), test, local, seed, t,
            1 << 20,
        )  # fmt: skip
        delta = update_of(state, base)
        value = norm(delta)
        self._ref_update = ((t, size), delta)
        if (t, size) in cache:  # computed again for its update: the event is already there
            return value
        cache[(t, size)] = value
        self.records.event("reference_norm", round=t, samples=size, norm=round(value, 6))
        log.info(
            "round %d: reference update norm %.4g (%d samples, %.1fs)",
            t,
            value,
            size,
            time.perf_counter() - w0,
        )
        return value


class Rounds:
    """The federation's rounds over the link: schedule, collect, check, aggregate, record.

    Owns the global model (:attr:`global_state`), the open round, the rounds' log
    (``rounds.jsonl``) and which robots' uploads closed each round. ``strategy``: the FedAvg
    round (screening, BatchNorm re-estimation, the server's evaluation); ``trusted``: its
    norm prior, told every round's accepted norms; ``poll``: the server's message loop.
    """

    def __init__(
        self,
        strategy: FedAvg,
        trusted: TrustedNorms | None,
        history: Any,
        sessions: Sessions,
        downlink: Downlink,
        records: Records,
        link: Link,
        tb: Any,
        run_dir: Path,
        clock: Callable[[], float],
        poll: Callable[[float], None],
        global_state: State,
    ) -> None:
        self.strategy = strategy
        self.trusted = trusted
        self.history = history
        self.sessions = sessions
        self.downlink = downlink
        self.records = records
        self.link = link
        self.tb = tb
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.poll = poll
        self.global_state = global_state
        self.open: RoundState | None = None
        self.log: list[dict[str, Any]] = []
        self.closed: dict[int, set[int]] = {}

    @property
    def current(self) -> int | None:
        """The open round's number (None between rounds)."""
        return self.open.t if self.open is not None else None

    def deadline(self) -> float | None:
        """The open round's deadline on the server's clock (None between rounds)."""
        return self.open.deadline if self.open is not None else None

    @property
    def aggregation(self) -> str:
        """The aggregation strategy's name (the rounds' ``aggregation`` column)."""
        sc = self.strategy.screening
        return sc.strategy if sc is not None else "fedavg"

    def reload(self, last: int) -> None:
        """The rounds logged before a restart, up to the last completed one."""
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
        self.log = [rows[t] for t in sorted(rows)]
        if self.trusted is not None:
            for row in self.log:
                self.trusted.record(row)

    # -- uploads ---------------------------------------------------------------------------

    def on_update(self, robot: RobotInfo, t: int, meta: Mapping[str, Any], body: bytes) -> None:
        """An UPDATE of ``robot`` for round ``t``: checked, decoded once into tensors, kept."""
        r = robot.robot_id
        rs = self.open
        if t in self.closed and r in self.closed[t]:
            self.records.reject(
                "duplicate", r, f"UPDATE r{t}", "round already closed with its update"
            )
            self._notify_reject(r, t, "duplicate")
            return
        if rs is None or t != rs.t:
            late = rs is None or t < rs.t
            self.records.reject("late" if late else "wrong_round", r, f"UPDATE r{t}")
            self._notify_reject(r, t, "late or wrong round")
            return
        if robot.forgotten:
            self.records.reject("forgotten", r, f"UPDATE r{t}")
            return
        if r not in rs.scheduled:
            self.records.reject("not_scheduled", r, f"UPDATE r{t}")
            return
        if r in rs.updates:
            self.records.reject("duplicate", r, f"UPDATE r{t}")
            self._notify_reject(r, t, "duplicate")
            return
        try:  # typed meta first: nothing is decoded or stored before it parses
            um = UpdateMeta.parse(meta)
        except ProtocolError as exc:
            self._refuse(rs, r, t, exc.reason, exc.detail)
            return
        base = arrays(rs.base)
        try:
            ref = base if um.delta else None
            state = decode_state(body, reference=ref)
            if ref is not None:  # a delta decodes in the reference's dtypes
                state = cast_like(state, base)
        except Exception as exc:
            self._refuse(rs, r, t, "malformed_tensors", repr(exc))
            return
        mn = self.tb.max_update_norm
        # dtypes are compared, not cast: a float64 upload of a float32 model is refused
        reason = validate_update(state, base, None if mn is None else float(mn))
        if reason is not None:
            self._refuse(rs, r, t, reason.split(":")[0], reason)
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

    def _refuse(self, rs: RoundState, r: int, t: int, reason: str, detail: str) -> None:
        """Refuse a robot's upload of the open round; the round stops waiting for it."""
        # the grace runs from the robot's latest refusal: a robot whose upload was refused and
        # that sends another (a corrected one) is awaited again, however many came before
        rs.refused[r] = self.clock()
        self.records.reject(reason, r, f"UPDATE r{t}", detail, round_=t)
        self._notify_reject(r, t, f"{reason}: {detail}"[:200])

    def _notify_reject(self, r: int, t: int, reason: str) -> None:
        # an answer to the robot's upload: charged to its airtime (not sent when throttled)
        self.sessions.answer(MsgType.REJECT, r, "UPDATE", t, {"reason": reason}, timeout=10.0)

    # -- a round ---------------------------------------------------------------------------

    def run_round(self, t: int) -> dict[str, Any] | None:
        """Round t: send, collect until all are in or the deadline, aggregate, record.

        Returns the round's row, or None when it failed (no update accepted, or the aggregate
        refused): the caller retries it.
        """
        tb = self.tb
        w0 = time.perf_counter()
        bytes0 = self.downlink.air_bytes()
        link0 = link_counters(self.link)
        adapt0 = link_adaptation(self.link)
        fallbacks0 = self.downlink.unicast_fallbacks
        base = self.global_state
        opened = self.clock()
        rs = RoundState(t, base, opened + float(tb.round_deadline_s))
        self.open = rs
        src = state_sha256(arrays(base))
        chosen = self._configure(t, [robot.robot_id for robot in self.sessions.active()])
        rs.scheduled.update(chosen)
        self.downlink.send_many(chosen, base, "train", t, src_sha=src)
        self.records.event("round_start", round=t, scheduled=sorted(rs.scheduled))
        next_progress = time.monotonic() + PROGRESS_S
        closed_by = "deadline"
        while self.clock() < rs.deadline:
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + PROGRESS_S
                self._progress(t, rs, adapt0)
            grace = float(tb.refused_grace_s)
            gone = rs.not_awaited(grace, self.link.receiving_from, self.clock())
            waiting = rs.scheduled - self.sessions.forgotten_ids() - gone
            if rs.scheduled and set(rs.updates) >= waiting:
                closed_by = "all_in"
                break
            self.poll(0.2)
            # robots that joined, re-registered or lost their model get it (again)
            active = [robot.robot_id for robot in self.sessions.active()]
            for r in self._configure(t, active):
                busy = r in rs.updates or r in rs.refused
                if not busy and self.downlink.needs(r, src):
                    rs.scheduled.add(r)
                    self.downlink.send(r, base, "train", t, src_sha=src)
        # how long the round collected, on the deadline's clock (the link's: virtual seconds on
        # ofdm-shared), and why it stopped: a load that slows the machine moves wall_s, not this
        collect_s = self.clock() - opened
        self.open = None
        # a round that aggregates is closed to its robots; a failed attempt is retried with
        # the same robots (their second upload of round t is not a duplicate)
        forgotten = self.sessions.forgotten_ids()
        missing = sorted(rs.scheduled - set(rs.updates) - forgotten - set(rs.refused))
        if missing:
            log.warning(
                "round %d closed with robots %s missing (deadline %.0fs)",
                t,
                missing,
                float(tb.round_deadline_s),
            )
            self.records.event("round_missing", round=t, robots=missing)
        if not rs.updates:
            log.warning("round %d: no update accepted", t)
            self.records.event("round_failed", round=t, reason="no valid update")
            return None
        # the robots' local models in robot order (the aggregate does not depend on arrival)
        replies = {client_of(r): rs.updates[r] for r in sorted(rs.updates)}
        try:
            res = self.strategy.aggregate_train(t, base, replies)
        except (NoUpdateAcceptedError, RoundRejectedError) as exc:
            log.warning("round %d: %s", t, exc)
            self.records.event("round_failed", round=t, reason=str(exc)[:200])
            if isinstance(exc, RoundRejectedError):  # the previous model stays
                self._candidate_rejected(t, exc.rejection, failed=True)
                refused = exc.rejection.named
            else:
                refused = exc.refused
            for c, why in refused.items():
                self._refuse(rs, robot_of(c), t, why.split(":")[0], why)
            return None
        if res.rejected is not None:  # the candidate with every update was refused
            self._candidate_rejected(t, res.rejected, failed=False)
        for c, why in res.refused.items():
            self._refuse(rs, robot_of(c), t, why.split(":")[0], why)
        self.closed[t] = set(rs.updates)
        metrics = self.strategy.evaluate(t, res.state)
        wall, _ = close_round(self.history, res, metrics, w0)
        self.global_state = res.state
        air = self.downlink.air_bytes() - bytes0
        row = {
            "round": t,
            **metrics,
            "participants": [robot_of(c) for c in res.clients],
            "missing": missing,
            "rejected": self.records.rejected_in(t),
            "aggregation": self.aggregation,
            "update_norms": {robot_of(c): round(v, 6) for c, v in res.norms.items()},
            "air_bytes": air,
            "aoi_s": self.downlink.aoi_seconds(),
            "wall_s": wall,
            "collect_s": round(collect_s, 3),
            "closed_by": closed_by,
            "train_s": {r: m.get("train_s") for r, m in rs.reported.items()},
        }
        if res.rejected is not None:
            row["rejected_candidate"] = self._rejection_json(res.rejected)
        row["link"] = round_link_row(link0, link_counters(self.link), air)
        adapt = round_adaptation(adapt0, link_adaptation(self.link))
        if adapt:
            row["link"]["adaptation"] = adapt
        if hasattr(self.link, "broadcast"):  # a MAC link: model sends moved off the broadcast
            row["link"]["unicast_fallbacks"] = self.downlink.unicast_fallbacks - fallbacks0
        self._log(row)
        self.records.event(
            "round_end", **{k: row[k] for k in ("round", "test_acc", "participants")}
        )
        log.info(
            "round %d done: acc %.3f, robots %s, %.1fs",
            t,
            metrics["test_acc"],
            row["participants"],
            wall,
        )
        return row

    def _progress(self, t: int, rs: RoundState, adapt0: dict[str, Any] | None) -> None:
        """One line per PROGRESS_S (wall) of a round in progress: for each robot whose update is
        not in yet, the bytes it got through this round, its uplink MCS and SNR (MAC links)."""
        now = round_adaptation(adapt0, link_adaptation(self.link))
        parts = []
        for r in sorted(rs.scheduled - set(rs.updates)):
            a = now.get("robots", {}).get(r)
            if a is None:
                parts.append(f"robot {r} waiting")
                continue
            kb = sum(a["bytes_up_by_mcs"].values()) / 1e3
            snr = "-" if a["up_snr_db"] is None else f"{a['up_snr_db']:.1f} dB"
            parts.append(f"robot {r} {kb:.0f} kB up at {a['up_mcs']} ({snr})")
        if parts:
            bc = now.get("broadcast_mcs")
            log.info(
                "round %d progress: %s%s",
                t,
                ", ".join(parts),
                f"; broadcast at {bc}" if bc else "",
            )

    @staticmethod
    def _rejection_json(rejection: CandidateRejection) -> dict[str, Any]:
        """A rejected candidate as the rounds' log and events give it (robot ids)."""
        out = rejection.to_json()
        out["robots"] = [robot_of(c) for c in out.pop("named")]
        out["scores"] = {
            (f"without_robot_{robot_of(int(k[8:]))}" if k.startswith("without_") else k): v
            for k, v in out["scores"].items()
        }
        return out

    def _candidate_rejected(self, t: int, rejection: CandidateRejection, failed: bool) -> None:
        """Record a candidate model an acceptance check refused, and the robots named."""
        info = self._rejection_json(rejection)
        log.warning(
            "round %d: candidate refused (%s); robots named: %s; %s",
            t,
            rejection.reason,
            info["robots"] or "none",
            "the previous model stays" if failed else "the round goes on without them",
        )
        self.records.event("candidate_rejected", round=t, failed=failed, **info)

    def _configure(self, t: int, active: list[int]) -> list[int]:
        """The robots the strategy has train round ``t`` among the ``active`` ones."""
        chosen = set(self.strategy.configure_train(t, [client_of(r) for r in active]))
        return [r for r in active if client_of(r) in chosen]

    def _log(self, row: dict[str, Any]) -> None:
        self.log.append(row)
        if self.trusted is not None:
            self.trusted.record(row)
        append_jsonl(self.run_dir / "rounds.jsonl", row)

    def record_failed_round(self, t: int, failures: int) -> dict[str, Any]:
        """Record round t as failed: no participant, Theta[t+1] = Theta[t].

        Called after ``max_round_retries`` retries of a round without a valid update. The
        history keeps its round numbering (the round's broadcast is charged to the link, no
        upload), ``rounds.jsonl`` gets a row with ``failed: true`` and the run goes on with
        round t + 1: one robot or one outsider cannot end the federation.
        """
        w0 = time.perf_counter()
        reasons = [e.get("reason") for e in self.records.events_of("round_failed")]
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
            "rejected": self.records.rejected_in(t),
            "aggregation": self.aggregation,
            "update_norms": {},
            "air_bytes": 0,
            "aoi_s": self.downlink.aoi_seconds(),
            "wall_s": wall,
            "train_s": {},
            "link": round_link_row(counters, counters, 0),
        }
        self._log(row)
        self.records.event("round_skipped", round=t, failures=failures, reason=row["reason"])
        log.error(
            "round %d failed %d times (%s): recorded with no participant, model unchanged; "
            "the federation goes on with round %d",
            t,
            failures,
            row["reason"],
            t + 1,
        )
        return row
