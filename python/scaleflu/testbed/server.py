"""Edge server: registers robots, runs FedAvg rounds over the link, serves unlearning requests.

One thread drives everything (Flower's ServerApp in spirit): it sends the global model to the
registered robots, collects their uploads until all are in or the round deadline passes,
validates each upload (authenticated sender, current round, scheduled robot, first accepted
upload, decodable, same names/shapes/dtypes, finite, optional norm bound), screens and
aggregates them with the one FedAvg round (:class:`scaleflu.fl.strategy.FedAvg`, robust
screening per ``testbed.aggregation``) and records the round in the history store
(``scaleflu.fl.history``), so a restarted server resumes after its last completed round and
SCALE can run on the history. A rejected message is logged with its reason and counted; it is
never aggregated, and no malformed packet escapes the handler.

Unlearning: a robot may ask to forget itself (``client``), one of its classes (``class``) or a
fraction of its samples (``sample``); the request is refused unless the authenticated sender is
the robot it concerns. After the last round the server runs the configured method
(``scaleflu.unlearn``, SCALE by default) on the history and model it holds, deploys the
unlearned model, collects every robot's RA/FA on its own data and writes the report.

The server is composed of parts that own their state and talk through small interfaces:

* :class:`~scaleflu.testbed.records.Records`: events and refused messages;
* :class:`~scaleflu.testbed.sessions.Sessions`: the allow-list, the session challenge, the
  registered robots, and the one way to send a robot an envelope (``send``, ``sign``);
* :class:`~scaleflu.testbed.downlink.Downlink`: model sends, what each robot holds, AoI;
* :class:`~scaleflu.testbed.rounds.Rounds`: the global model, the open round, its uploads,
  aggregation (the strategy) and the rounds' log;
* :class:`~scaleflu.testbed.unlearn_service.UnlearningService`: requests, their service,
  deployment of the unlearned model, comparison and erasure.

:class:`EdgeServer` builds them, owns the message loop (:meth:`EdgeServer.poll`: each message
is authenticated once and handed to the part it concerns) and runs the federation
(:meth:`EdgeServer.run`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scaleflu.config import Config, ConfigError, save_config
from scaleflu.fl.aggregation import AggregationConfig
from scaleflu.fl.fedavg import BNRecalibrator
from scaleflu.fl.integrity import HistoryHeads, trust
from scaleflu.fl.run import (
    LoadedRun,
    build_setup,
    open_history,
    write_training_outputs,
)
from scaleflu.fl.strategy import FedAvg, ValidationCheck
from scaleflu.keys import history_key
from scaleflu.link import Link
from scaleflu.link.arq import UNTRUSTED_REASSEMBLY_BYTES
from scaleflu.testbed.airtime import Airtime
from scaleflu.testbed.common import arrays, encode_state, federation_config, link_clock
from scaleflu.testbed.downlink import Downlink
from scaleflu.testbed.protocol import (
    SERVER_ID,
    MsgType,
    ProtocolError,
    ReplayGuard,
    client_of,
    open_envelope,
)
from scaleflu.testbed.records import EventHook, Records
from scaleflu.testbed.rounds import Rounds, TrustedNorms
from scaleflu.testbed.sessions import Sessions
from scaleflu.testbed.transport import link_stats
from scaleflu.testbed.unlearn_service import CompareFn, UnlearnFn, UnlearningService
from scaleflu.testbed.validation import RateLimiter

log = logging.getLogger(__name__)

# a full MODEL envelope beyond its body: header, nonce, tag, meta with signature (about 600 B)
FULL_MODEL_OVERHEAD = 1024

# rounds.jsonl's columns in the run's metrics.csv (robot ids in participants and missing)
ROUNDS_CSV_COLUMNS = ("round", "test_acc", "test_loss", "asr", "participants", "missing")
ROUNDS_CSV_COLUMNS += ("rejected", "aggregation", "air_bytes", "aoi_s", "wall_s")


class EdgeServer:
    """The edge server application (see the module docstring)."""

    def __init__(
        self,
        link: Link,
        keys: Mapping[int, bytes],
        cfg: Mapping[str, Any],
        run_dir: str | Path,
        progress: bool = True,
        unlearn_fn: UnlearnFn | None = None,
        on_event: EventHook | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        compare_fn: CompareFn | None = None,
        heads: str | Path | None = None,
    ) -> None:
        """Open (or resume) the run in ``run_dir``; ``keys`` maps robot id -> K_r (allow-list).

        ``signing_key``: the server's Ed25519 identity (``scaleflu.testbed.keys.KeyStore``);
        models, grants and erasure receipts are signed with it. None: a fresh one (robots must
        then be given ``server.public_key``). ``unlearn_fn`` / ``compare_fn``: the methods that
        serve a request and run beside it (default: the method registry, ``testbed.unlearn``).
        ``heads``: the file of the history's signed versions (``keys.heads.json`` beside the
        key store, :func:`scaleflu.fl.integrity.heads_path`): a history older than the last
        version this server signed is refused on open. None: freshness is not checked.
        """
        self.link = link
        # deadlines of rounds and deployments on the link's clock: the shared medium's virtual
        # time on ofdm-shared (a busy, slow medium stretches the wall time, not the round)
        self.clock = link_clock(link)
        signing_key = signing_key or Ed25519PrivateKey.generate()
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.cfg = self._resolve_config(cfg, keys)
        tb = self.tb = self.cfg.testbed
        agg_cfg = AggregationConfig.from_dict(dict(tb.aggregation))
        self.limits = RateLimiter(
            {
                "resync": float(tb.resync_min_interval_s),
                "request": float(tb.request_min_interval_s),
                "hello": 0.5,  # answers to session-0 REGISTERs (challenge requests)
            }
        )
        self.guard = ReplayGuard()
        self.t0 = time.monotonic()
        self.bytes_rx = 0
        torch.set_num_threads(max(1, int(self.cfg.fl.threads) or 1))
        self.setup = build_setup(self.cfg)
        self.model = self.setup.new_model()  # the server's evaluation model
        # fl.bn_recalibration: BatchNorm statistics re-estimated on the server's validation
        # images after every aggregation, as `scaleflu train` does (a no-op when 0 or no BN)
        self.bn_recal = BNRecalibrator.from_config(
            self.cfg, self.setup.new_model(), self.setup.test
        )
        # the history (SQLite metadata, tensor files) and the saved models carry an
        # authenticated digest under a key only this server holds, checked on load
        self.integrity_key = history_key(signing_key)
        signed = HistoryHeads(heads, self.integrity_key) if heads is not None else None
        if signed is None:
            log.warning(
                "no history heads file: a history store put back from an older copy would not "
                "be noticed (the server app keeps it beside its key store)"
            )
        trust(self.run_dir, self.integrity_key, heads=signed, signer=signing_key)
        self.history = open_history(self.cfg, self.run_dir, self.model)
        last = self.history.last_completed_round()
        if last == 0:
            self.history.record_initial(self.model.state_dict())
        global_state = self.history.global_model(last + 1)
        self.model.load_state_dict(global_state)

        self.records = Records(self.run_dir, keys, self.t0, on_event, lambda: self.rounds.current)
        # what a robot's own requests may make the server send (testbed.airtime): a RESYNC is
        # charged a full model, every answer (hello, REGISTER_ACK, UNLEARN_ACK, REJECT) its size
        full_model = len(encode_state(arrays(global_state))) + FULL_MODEL_OVERHEAD
        self.airtime = Airtime.from_config(
            tb.airtime,
            full_model,
            self.clock,
            lambda r, what, n: self.records.event("throttled", robot=r, request=what, count=n),
        )
        self.full_model_bytes = full_model
        self._check_broadcast_fits(link, full_model)
        self.sessions = Sessions(
            link,
            keys,
            signing_key,
            self.records,
            self.clock,
            self.poll,
            lambda: self.history.last_completed_round() + 1,
            self.setup.data_sizes,
            require_auth=tb.arq.require_auth is not False,
            airtime=self.airtime,
        )
        self.downlink = Downlink(
            link,
            self.sessions,
            self.records,
            tb,
            int(self.cfg.scale.groups_per_layer),
            self.history.groups,
            float(self.history.update_tol),
            self.clock,
            self.t0,
            global_state,
            round_deadline=lambda: self.rounds.deadline(),
        )
        # the round: every registered robot trains; robust screening (testbed.aggregation)
        # with a floor from trusted norms, BatchNorm re-estimation, the server's evaluation
        trusted = TrustedNorms(agg_cfg, self.setup, self.cfg, self.records)
        # the candidate model on the server's validation data before it is accepted (its own
        # network: a refused candidate must not linger in the server's evaluation model)
        check = ValidationCheck.from_config(
            agg_cfg, self.setup.new_model(), self.setup.test, int(self.cfg.seed)
        )
        strategy = FedAvg(
            self.setup.data_sizes,
            int(self.cfg.seed),
            None,
            screening=agg_cfg,
            recalibrate=self.bn_recal,
            evaluator=self.setup.evaluator(self.model, self.cfg.fl.eval_batch_size),
            norm_prior=trusted,
            reference=trusted.reference_update,
            checks=[check] if check is not None else [],
        )
        self.rounds = Rounds(
            strategy,
            trusted,
            self.history,
            self.sessions,
            self.downlink,
            self.records,
            link,
            tb,
            self.run_dir,
            self.clock,
            self.poll,
            global_state,
        )
        self.unlearning = UnlearningService(
            self.sessions,
            self.downlink,
            self.records,
            self.history,
            self.held_run,
            tb,
            self.run_dir,
            self.clock,
            self.poll,
            int(self.setup.train.num_classes),
            unlearn_fn,
            compare_fn,
            progress,
        )
        if last > 0:
            log.info("resuming %s after round %d (history store)", self.run_dir, last)
            self.records.event("resume", last_completed_round=last)
            self.rounds.reload(last)
            self.records.reload()
        self.unlearning.reload()

    @property
    def session(self) -> int:
        """This server start's session (the challenge every REGISTER carries)."""
        return self.sessions.session

    @property
    def public_key(self) -> bytes:
        """The server's Ed25519 public key (robots check models and grants against it)."""
        return self.sessions.public_key

    @property
    def global_state(self) -> dict[str, torch.Tensor]:
        """The current global model."""
        return self.rounds.global_state

    def held_run(self) -> LoadedRun:
        """The run this server holds, as :func:`scaleflu.fl.run.load_run` rebuilds one from its
        folder: config, data and partitions, the history store and the current global model
        (what the unlearning methods run on, without reading the run folder again)."""
        return LoadedRun.held(
            self.run_dir, self.setup, self.history, self.rounds.global_state, self.model
        )

    def _resolve_config(self, cfg: Mapping[str, Any], keys: Mapping[int, bytes]) -> Config:
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
        bad = [r for r in keys if not 0 <= client_of(r) < n]
        if bad:
            raise ConfigError(f"robot ids {bad} have no FL client (data.num_clients = {n})")
        save_config(cfg, saved)
        return cfg

    # -- the message loop -----------------------------------------------------------------

    def poll(self, timeout: float) -> None:
        """Handle at most one incoming message (waiting up to ``timeout``) and finished sends."""
        self.downlink.check_sends()
        got = self.link.recv(timeout)
        if got is None:
            return
        src, data = got
        self.bytes_rx += len(data)
        try:
            self._handle(src, data)
        except ProtocolError as exc:
            if exc.reason != "throttled":  # counted by the airtime budget, logged sparsely
                self.records.reject(exc.reason, src, "message", exc.detail)
        except Exception as exc:  # a malformed packet must never take the server down
            log.exception("message from node %s crashed its handler", src)
            self.records.reject("handler_error", src, "message", repr(exc))

    def _handle(self, src: int, data: bytes) -> None:
        """Authenticate one envelope, rate-limit what may be abused, hand it to its part."""
        env = open_envelope(
            data,
            src,
            self.sessions.keys,
            SERVER_ID,
            self.sessions.session,
            self.guard,
            max_skew_s=float(self.tb.max_skew_s),
        )
        r = env.sender
        if env.type is MsgType.REGISTER:
            if env.session == 0:  # the robot asks for this server's challenge (its session)
                if not self.limits.allow(r, "hello"):
                    raise ProtocolError("rate_limited", "challenge requests too often")
                self.sessions.hello(r)
            else:  # what the robot holds stays known: a registration never resends a model
                self.sessions.register(r, env.meta, self.downlink.held_sha(r))
            return
        robot = self.sessions.heard(r)
        if robot is None:
            raise ProtocolError("not_registered", f"{env.type.name} before REGISTER")
        if env.type is MsgType.UPDATE:
            self.rounds.on_update(robot, env.round, env.meta, env.body)
        elif env.type is MsgType.UNLEARN_REQUEST:
            if not self.limits.allow(r, "request"):
                raise ProtocolError("rate_limited", "UNLEARN_REQUEST more often than allowed")
            self.unlearning.on_request(robot, env.meta)
        elif env.type is MsgType.EVAL_REPORT:
            self.unlearning.on_eval_report(robot, env.meta)
        elif env.type is MsgType.RESYNC:
            if not self.limits.allow(r, "resync"):
                raise ProtocolError("rate_limited", "RESYNC more often than resync_min_interval_s")
            self.sessions.charge(r, self.full_model_bytes, "RESYNC")  # a full model follows
            self.downlink.forget(r)
            log.info("robot %d asked for a full model next time", r)
        else:
            raise ProtocolError("unexpected_type", env.type.name)

    def _check_broadcast_fits(self, link: Link, full_model: int) -> None:
        """Warn when a full model is larger than what robots hold of broadcasts: broadcast
        frames carry no link tag, so robots keep them within the untrusted reassembly budget
        (``testbed.arq.reassembly_max_bytes_untrusted``); a larger model body is refused there
        and reaches each robot by unicast after its broadcast stalls."""
        tb = self.tb
        if str(tb.downlink) == "unicast" or getattr(link, "broadcast", None) is None:
            return
        budget = tb.arq.reassembly_max_bytes_untrusted or UNTRUSTED_REASSEMBLY_BYTES
        if full_model > int(budget):
            log.warning(
                "a full model (%d B) is larger than robots hold of broadcasts "
                "(testbed.arq.reassembly_max_bytes_untrusted = %d B): the broadcast downlink "
                "falls back to unicast; set it to at least %d on the robots",
                full_model,
                int(budget),
                full_model + (1 << 20),
            )

    # -- the federation -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Rounds, then the unlearning request (if any), deployment, report; returns the report."""
        tb = self.tb
        sessions, rounds, unlearning = self.sessions, self.rounds, self.unlearning
        started = time.monotonic()
        sessions.announce()
        if not sessions.wait_for_robots(int(tb.min_robots), float(tb.register_timeout_s)):
            raise RuntimeError(f"fewer than {tb.min_robots} robots registered in time")
        T = int(tb.rounds)
        t = self.history.last_completed_round() + 1
        retries = 0
        round_start = self.clock()
        while t <= T:
            sessions.wait_for_robots(int(tb.min_robots), float(tb.register_timeout_s))
            round_start = self.clock()  # compared with the robots' last_heard (link's clock)
            row = rounds.run_round(t)
            if row is None:  # a failed round is logged and retried ...
                retries += 1
                if retries <= int(tb.max_round_retries):
                    continue
                # ... and after max_round_retries it is recorded with no participant (the
                # model unchanged): the federation goes on with the next round
                rounds.record_failed_round(t, retries)
            retries = 0
            t += 1
        fl_s = time.monotonic() - started
        report: dict[str, Any] = {"rounds": rounds.log, "fl_s": fl_s}
        # on the wall clock, unlike the waits for a transfer: this one waits for a request that
        # may never come, and on ofdm-shared the MAC's polls and beacons keep the medium at its
        # busy speed (its clock runs far slower than the wall there); a request is one frame,
        # sent right after the robot's last upload
        wait_end = time.monotonic() + float(tb.unlearn.wait_s)
        while not unlearning.requests and time.monotonic() < wait_end:
            self.poll(0.2)
        if unlearning.requests:  # a robot that died in the last round and restarts: evaluate it
            sessions.wait_for_rejoin(round_start, float(tb.register_timeout_s))
        # every accepted request is served, in order, even when an earlier one fails; requests
        # that arrive while one is served are served after it
        served: list[dict[str, Any]] = []
        i = 0
        while i < len(unlearning.requests):
            req = unlearning.requests[i]
            i += 1
            try:
                served.append(unlearning.serve(req))
                if served[-1].get("erasure"):  # the history's final model is the served one:
                    rounds.global_state = self.history.final_model()  # the next starts there
            except Exception as exc:  # keep the rounds' report, go on with the next request
                log.exception("unlearning request %s failed", req.text)
                self.records.event("unlearn_failed", request=req.text, error=repr(exc)[:200])
                served.append({"request": req.to_json(), "error": repr(exc)})
        if served:
            report["unlearning"] = served[0]
            report["unlearning_all"] = served
        sessions.finish()
        # metrics.csv, training.png as every FedAvg run writes them; drawn once the robots are
        # released (BYE): plotting in this process must not delay the link while they are on air
        write_training_outputs(
            rounds.log,
            self.run_dir,
            ROUNDS_CSV_COLUMNS,
            f"testbed FedAvg: {self.run_dir.name}",
        )
        report.update(self.report(time.monotonic() - started))
        return report

    def report(self, total_s: float) -> dict[str, Any]:
        """The report's part about the server: robots, refused messages, events, the link."""
        return {
            "total_s": total_s,
            "session": f"{self.sessions.session:08x}",
            "robots": self.sessions.report(),
            **self.records.report(),
            "nonce_reuses": self.guard.nonce_reuses,
            "airtime": self.airtime.report(),
            "server_link": link_stats(self.link),
            "server_tx_bytes": self.sessions.ep.sent_bytes,
            "server_rx_bytes": self.bytes_rx,
            "air_bytes_total": self.downlink.air_bytes(),
            "unicast_fallbacks": self.downlink.unicast_fallbacks,
            "history_rounds": self.history.last_completed_round(),
            "poison": {
                "backdoor_clients": self.cfg.data.poison.backdoor_clients,
                "target_label": self.setup.poison.target_label,
            },
        }
