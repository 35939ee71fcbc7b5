"""Edge server: registers robots, runs FedAvg rounds over the link, serves unlearning requests.

One thread drives everything (Flower's ServerApp in spirit): it sends the global model to the
registered robots, collects their uploads until all are in or the round deadline passes,
validates each upload (authenticated sender, current round, scheduled robot, first accepted
upload, decodable, same names/shapes/dtypes, finite, optional norm bound), aggregates with
FedAvg (``scaleflu.fl.fedavg.aggregate``) and records the round in the history store
(``scaleflu.fl.history``), so a restarted server resumes after its last completed round and
SCALE can run on the history. A rejected message is logged with its reason and counted; it is
never aggregated, and no malformed packet escapes the handler.

Unlearning: a robot may ask to forget itself (``client``), one of its classes (``class``) or a
fraction of its samples (``sample``); the request is refused unless the authenticated sender is
the robot it concerns. After the last round the server runs the configured method
(``scaleflu.unlearn``, SCALE by default) on its history, deploys the unlearned model, collects
every robot's RA/FA on its own data and writes the report.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scaleflu.config import Config, ConfigError, save_config
from scaleflu.fl.aggregation import AggregationConfig
from scaleflu.fl.fedavg import BNRecalibrator
from scaleflu.fl.integrity import trust
from scaleflu.fl.run import build_setup, open_history, write_training_outputs
from scaleflu.fl.strategy import FedAvg
from scaleflu.link import Link
from scaleflu.testbed.common import (
    Endpoint,
    federation_config,
    install_link_keys,
    link_clock,
)
from scaleflu.testbed.downlink import DownlinkMixin, Outgoing
from scaleflu.testbed.keys import history_key, public_bytes
from scaleflu.testbed.protocol import (
    SERVER_ID,
    MsgType,
    ProtocolError,
    ReplayGuard,
    client_of,
    open_envelope,
)
from scaleflu.testbed.records import RecordsMixin
from scaleflu.testbed.rounds import RoundsMixin, RoundState
from scaleflu.testbed.sessions import RobotInfo, SessionsMixin
from scaleflu.testbed.unlearn_service import (
    UNLEARN_KINDS,
    UnlearnFn,
    UnlearningMixin,
    compare_unlearn,
    default_unlearn,
    side_by_side_row,
    unlearn_request_text,
)
from scaleflu.testbed.validation import EvalMeta, RateLimiter

log = logging.getLogger(__name__)

# rounds.jsonl's columns in the run's metrics.csv (robot ids in participants and missing)
ROUNDS_CSV_COLUMNS = ("round", "test_acc", "test_loss", "asr", "participants", "missing")
ROUNDS_CSV_COLUMNS += ("rejected", "aggregation", "air_bytes", "aoi_s", "wall_s")

__all__ = [  # the parts, importable from here as before the split
    "UNLEARN_KINDS",
    "EdgeServer",
    "Outgoing",
    "RobotInfo",
    "RoundState",
    "UnlearnFn",
    "compare_unlearn",
    "default_unlearn",
    "side_by_side_row",
    "unlearn_request_text",
]


class EdgeServer(SessionsMixin, RoundsMixin, DownlinkMixin, UnlearningMixin, RecordsMixin):
    """The edge server application (see the module docstring).

    Composed of small parts: :mod:`~scaleflu.testbed.sessions` (registration),
    :mod:`~scaleflu.testbed.rounds` (round scheduler), :mod:`~scaleflu.testbed.downlink`
    (model sends, AoI), :mod:`~scaleflu.testbed.unlearn_service` (requests and their
    service), :mod:`~scaleflu.testbed.records` (events, rejections, report).
    """

    def __init__(
        self,
        link: Link,
        keys: Mapping[int, bytes],
        cfg: Mapping[str, Any],
        run_dir: str | Path,
        progress: bool = True,
        unlearn_fn: UnlearnFn | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        signing_key: Ed25519PrivateKey | None = None,
    ) -> None:
        """Open (or resume) the run in ``run_dir``; ``keys`` maps robot id -> K_r (allow-list).

        ``signing_key``: the server's Ed25519 identity (``scaleflu.testbed.keys.KeyStore``);
        models and grants are signed with it. None: a fresh one (robots must then be given
        ``server.public_key``).
        """
        self.link = link
        # deadlines of rounds and deployments on the link's clock: the shared medium's virtual
        # time on ofdm-shared (a busy, slow medium stretches the wall time, not the round)
        self.clock = link_clock(link)
        self.signing_key = signing_key or Ed25519PrivateKey.generate()
        self.public_key = public_bytes(self.signing_key)
        self.keys = dict(keys)
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.unlearn_fn = unlearn_fn or default_unlearn
        self.compare_fn = compare_unlearn  # testbed.unlearn.compare: the side-by-side methods
        self._served: tuple[dict[str, Any], Mapping[str, Any], Any] | None = None
        self.on_event = on_event
        self.cfg = self._resolve_config(cfg)
        tb = self.cfg.testbed
        self.tb = tb
        self.agg_cfg = AggregationConfig.from_dict(dict(tb.aggregation))
        self.limits = RateLimiter(
            {
                "resync": float(tb.resync_min_interval_s),
                "request": float(tb.request_min_interval_s),
                "hello": 0.5,  # answers to session-0 REGISTERs (challenge requests)
            }
        )
        self.ep = Endpoint(link, SERVER_ID)
        install_link_keys(link, self.keys, SERVER_ID)
        self.session = secrets.randbits(32) | 1
        self.guard = ReplayGuard()
        self.robots: dict[int, RobotInfo] = {}
        self.round: RoundState | None = None
        self.outgoing: list[Outgoing] = []
        self.unicast_fallbacks = 0  # model sends moved from a stalled broadcast to a unicast
        self._send_seq = 0  # id of each model send (MODEL meta "send_id"; a fall-back keeps it)
        self.rejections: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.eval_reports: dict[str, dict[int, dict[str, Any]]] = {}
        self.rounds_log: list[dict[str, Any]] = []
        self.closed_rounds: dict[int, set[int]] = {}
        self._ref_norms: dict[tuple[int, int], float] = {}  # (round, size) -> reference norm
        self._outsider_rejects: dict[tuple[int | None, str], int] = {}  # (node, reason) -> n
        self._forgotten_before: set[int] = set()  # client requests accepted before a restart
        self.t0 = time.monotonic()
        self.group_time: dict[tuple[str, int], float] = {}
        self.bytes_rx = 0
        torch.set_num_threads(max(1, int(self.cfg.fl.threads) or 1))
        self.setup = build_setup(self.cfg)
        self.model = self.setup.new_model()
        # fl.bn_recalibration: BatchNorm statistics re-estimated on the server's validation
        # images after every aggregation, as `scaleflu train` does (a no-op when 0 or no BN)
        self.bn_recal = BNRecalibrator.from_config(
            self.cfg, self.setup.new_model(), self.setup.test
        )
        # the history (SQLite metadata, tensor files) and the saved models carry an
        # authenticated digest under a key only this server holds, checked on load
        self.integrity_key = history_key(self.signing_key)
        trust(self.run_dir, self.integrity_key)
        self.history = open_history(self.cfg, self.run_dir, self.model)
        last = self.history.last_completed_round()
        if last == 0:
            self.history.record_initial(self.model.state_dict())
        else:
            log.info("resuming %s after round %d (history store)", self.run_dir, last)
            self._event("resume", last_completed_round=last)
            self._reload_logs(last)
        self._reload_requests()
        self.global_state = self.history.global_model(last + 1)
        self.model.load_state_dict(self.global_state)
        # the round: every registered robot trains; robust screening (testbed.aggregation),
        # BatchNorm re-estimation, the server's evaluation on its test split
        self.strategy = FedAvg(
            self.setup.data_sizes,
            int(self.cfg.seed),
            None,
            screening=self.agg_cfg,
            recalibrate=self.bn_recal,
            evaluator=self.setup.evaluator(self.model, int(self.cfg.fl.eval_batch_size)),
            norm_prior=self.norm_prior,
        )
        self.groups = self.history.groups
        self.group_time = {g: 0.0 for g in self._all_groups()}
        self._prev_broadcast = self.global_state

    def _resolve_config(self, cfg: dict[str, Any]) -> Config:
        """Use the run's saved config when resuming; check robot ids against the clients.

        Returns the checked :class:`~scaleflu.config.Config` (fl.rounds := testbed.rounds).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        saved = self.run_dir / "config.yaml"
        if saved.is_file() and (self.run_dir / "history").is_dir():
            old = yaml.safe_load(saved.read_text())
            for sec in ("data", "model", "seed"):
                if old.get(sec) != cfg.get(sec):
                    raise ConfigError(
                        f"{self.run_dir} holds a run with a different {sec!r} section; "
                        "use another --run-dir"
                    )
            cfg = {**old, "testbed": cfg.get("testbed", old.get("testbed"))}
        cfg = federation_config(cfg)  # a copy: the caller's config is not changed
        n = int(cfg.data.num_clients)
        bad = [r for r in self.keys if not 0 <= client_of(r) < n]
        if bad:
            raise ConfigError(f"robot ids {bad} have no FL client (data.num_clients = {n})")
        save_config(cfg, saved)
        return cfg

    def poll(self, timeout: float) -> None:
        """Handle at most one incoming message (waiting up to ``timeout``) and finished sends."""
        self._check_sends()
        got = self.link.recv(timeout)
        if got is None:
            return
        src, data = got
        self.bytes_rx += len(data)
        try:
            self._handle(src, data)
        except ProtocolError as exc:
            self._reject(exc.reason, src, "message", exc.detail)
        except Exception as exc:  # a malformed packet must never take the server down
            log.exception("message from node %s crashed its handler", src)
            self._reject("handler_error", src, "message", repr(exc))

    def _handle(self, src: int, data: bytes) -> None:
        env = open_envelope(
            data,
            src,
            self.keys,
            SERVER_ID,
            self.session,
            self.guard,
            max_skew_s=float(self.tb.max_skew_s),
        )
        r = env.sender
        if env.type is MsgType.REGISTER:
            if env.session == 0:  # the robot asks for this server's challenge (its session)
                if not self.limits.allow(r, "hello"):
                    raise ProtocolError("rate_limited", "challenge requests too often")
                self.ep.send(
                    MsgType.SERVER_HELLO, r, self.keys[r], self.session, 0, {}, timeout=5.0
                )
                return
            self._on_register(r, env.meta)
            return
        robot = self.robots.get(r)
        if robot is None:
            raise ProtocolError("not_registered", f"{env.type.name} before REGISTER")
        robot.last_heard = self.clock()
        if env.type is MsgType.UPDATE:
            self._on_update(robot, env.round, env.meta, env.body)
        elif env.type is MsgType.UNLEARN_REQUEST:
            self._on_unlearn_request(robot, env.meta)
        elif env.type is MsgType.EVAL_REPORT:
            em = EvalMeta.parse(env.meta)
            purpose = em.purpose
            self.eval_reports.setdefault(purpose, {})[r] = dict(env.meta)
            robot.link_bytes_tx = em.link_bytes_tx
            from scaleflu.log import fmt

            log.info(
                "robot %d evaluated the %s model: %s", r, purpose, fmt(env.meta.get("metrics"))
            )
        elif env.type is MsgType.RESYNC:
            if not self.limits.allow(r, "resync"):
                raise ProtocolError("rate_limited", "RESYNC more often than resync_min_interval_s")
            robot.held, robot.held_sha = None, None
            robot.resync_at = time.monotonic()
            log.info("robot %d asked for a full model next time", r)
        else:
            raise ProtocolError("unexpected_type", env.type.name)

    def run(self) -> dict[str, Any]:
        """Rounds, then the unlearning request (if any), deployment, report; returns the report."""
        tb = self.tb
        started = time.monotonic()
        self.announce()
        if not self.wait_for_robots(int(tb.min_robots), float(tb.register_timeout_s)):
            raise RuntimeError(f"fewer than {tb.min_robots} robots registered in time")
        T = int(tb.rounds)
        t = self.history.last_completed_round() + 1
        retries = 0
        round_start = self.clock()
        while t <= T:
            self.wait_for_robots(int(tb.min_robots), float(tb.register_timeout_s))
            round_start = self.clock()  # compared with the robots' last_heard (link's clock)
            row = self.run_round(t)
            if row is None:  # a failed round is logged and retried ...
                retries += 1
                if retries <= int(tb.max_round_retries):
                    continue
                # ... and after max_round_retries it is recorded with no participant (the
                # model unchanged): the federation goes on with the next round
                self.record_failed_round(t, retries)
            retries = 0
            t += 1
        fl_s = time.monotonic() - started
        report: dict[str, Any] = {"rounds": self.rounds_log, "fl_s": fl_s}
        # on the wall clock, unlike the waits for a transfer: this one waits for a request that
        # may never come, and on ofdm-shared the MAC's polls and beacons keep the medium at its
        # busy speed, so 120 s of its clock took more than 7 wall minutes (a one-round run with
        # --unlearn none hit the launcher's timeout); a request is one frame, sent right after
        # the robot's last upload
        wait_end = time.monotonic() + float(tb.unlearn.wait_s)
        while not self.requests and time.monotonic() < wait_end:
            self.poll(0.2)
        if self.requests:  # a robot that died in the last round and restarts: evaluate it too
            self.wait_for_rejoin(round_start, float(tb.register_timeout_s))
        # every accepted request is served, in order, even when an earlier one fails; requests
        # that arrive while one is served are served after it
        served: list[dict[str, Any]] = []
        i = 0
        while i < len(self.requests):
            req = self.requests[i]
            i += 1
            try:
                served.append(self.serve_unlearning(req))
            except Exception as exc:  # keep the rounds' report, go on with the next request
                log.exception("unlearning request %s failed", req.get("text"))
                self._event("unlearn_failed", request=req.get("text"), error=repr(exc)[:200])
                served.append({"request": req, "error": repr(exc)})
        if served:
            report["unlearning"] = served[0]
            report["unlearning_all"] = served
        self.finish()
        # metrics.csv, training.png as every FedAvg run writes them; drawn once the robots are
        # released (BYE): plotting in this process must not delay the link while they are on air
        write_training_outputs(
            self.rounds_log,
            self.run_dir,
            ROUNDS_CSV_COLUMNS,
            f"testbed FedAvg: {self.run_dir.name}",
        )
        un = report.get("unlearning")
        if un is not None and not un.get("error") and self._served is not None:
            try:
                self.after_serving(un)
            except Exception as exc:  # the served request stands; say what did not happen
                log.exception("comparison / erasure after unlearning failed")
                un["after_serving_error"] = repr(exc)
        report.update(self._report_common(time.monotonic() - started))
        return report
