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

import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scaleflu.config import ConfigError, save_config
from scaleflu.fl.aggregation import AggregationConfig, NoUpdateAcceptedError, robust_aggregate
from scaleflu.fl.fedavg import attack_success_rate, evaluate
from scaleflu.fl.run import build_setup, open_history
from scaleflu.link import Link
from scaleflu.link.arq import SendHandle
from scaleflu.testbed.common import (
    Endpoint,
    cast_like,
    decode_state,
    encode_state,
    install_link_keys,
    to_numpy,
    to_torch,
)
from scaleflu.testbed.keys import private_bytes, public_bytes, sign
from scaleflu.testbed.protocol import (
    SERVER_ID,
    MsgType,
    ProtocolError,
    ReplayGuard,
    derive_key,
    open_envelope,
    state_sha256,
    validate_update,
)
from scaleflu.testbed.transport import (
    JointHandle,
    link_counters,
    link_stats,
    pack_broadcast_body,
    round_link_row,
)
from scaleflu.testbed.validation import EvalMeta, RateLimiter, RegisterMeta, UnlearnMeta, UpdateMeta

log = logging.getLogger(__name__)

UNLEARN_KINDS = ("client", "class", "sample")


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


@dataclass
class Outgoing:
    """A model send in flight, with what the robot will hold once it is delivered."""

    robot: int
    handle: SendHandle
    state: dict[str, np.ndarray]
    sha: str
    src_sha: str
    purpose: str
    round: int
    changed: set[tuple[str, int]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)


@dataclass
class RoundState:
    """The open round: scheduled robots and the uploads accepted so far."""

    t: int
    global_np: dict[str, np.ndarray]
    deadline: float
    scheduled: set[int] = field(default_factory=set)
    updates: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    refused: dict[int, float] = field(default_factory=dict)  # robot -> when its upload was refused

    def not_awaited(self, grace_s: float) -> set[int]:
        """Robots refused more than ``grace_s`` ago: the round no longer waits for them."""
        now = time.monotonic()
        return {r for r, at in self.refused.items() if now - at > grace_s}

    reported: dict[int, dict[str, Any]] = field(default_factory=dict)


def unlearn_request_text(meta: Mapping[str, Any], robot: int) -> str:
    """The scaleflu.unlearn request text for a robot's request (client index = robot - 1)."""
    kind = meta.get("kind")
    n = robot - 1
    if kind == "client":
        return f"client:{n}"
    if kind == "class":
        classes = [int(c) for c in meta.get("classes") or []]
        if not classes:
            raise ValueError("a class request needs classes")
        return f"class:{','.join(map(str, classes))}@{n}"
    if kind == "sample":
        frac = float(meta.get("fraction", 0.0))
        if not 0.0 < frac <= 1.0:
            raise ValueError("a sample request needs 0 < fraction <= 1")
        return f"sample:{n}:{frac}"
    raise ValueError(f"unknown request kind {kind!r}")


def default_unlearn(
    run_dir: Path, request: str, method: str, mode: str, overrides: list[str], progress: bool
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Unlearn on the run's history in memory (the method registry): (state, result dict)."""
    from scaleflu.unlearn.registry import run_unlearning

    done = run_unlearning(
        run_dir, request, method, mode, overrides=list(overrides), progress=progress
    )
    return done.state, done.result.to_dict()


def compare_unlearn(
    run_dir: Path, request: str, method: str, overrides: list[str], progress: bool
) -> dict[str, Any]:
    """Run another method on the same request for the side-by-side table (not deployed).

    Writes to ``run_dir/unlearn_compare/<method>``; returns its result dict, or
    ``{"method", "error"}`` when the method cannot run (e.g. not in this build).
    """
    from scaleflu.unlearn.cli import run_unlearn

    try:
        out = run_unlearn(
            run_dir,
            request,
            method=method,
            out=run_dir / "unlearn_compare" / method,
            overrides=list(overrides),
            progress=progress,
        )
    except (ValueError, KeyError, ImportError) as exc:
        log.warning("comparison method %s on %s not run: %s", method, request, exc)
        return {"method": method, "error": str(exc)}
    return json.loads((out / "result.json").read_text())


def side_by_side_row(result: Mapping[str, Any], air_bytes: int | None = None) -> dict[str, Any]:
    """One method's row of the side-by-side table from its result dict."""
    if result.get("error"):
        return {"method": result.get("method"), "error": result["error"]}
    m = result.get("metrics") or {}
    c = result.get("cost") or {}
    mia = m.get("mia_loss_auc")
    for key in ("mia_calibrated_auc", "mia_auc"):  # the calibrated audit where it exists
        if m.get(key) is not None:
            mia = m[key]
            break
    return {
        "method": result.get("method"),
        "asr": m.get("backdoor_asr"),
        "test_acc": m.get("test_acc"),
        "ra": m.get("ra"),
        "fa": m.get("fa_protocol"),
        "mia_auc": mia,
        "wall_s": c.get("wall_s"),
        "cpu_s": c.get("cpu_s"),
        "startup_s": (result.get("details") or {}).get("startup_s"),
        "link_bytes": c.get("bytes"),  # the method's own FL traffic on the simulated link
        "air_bytes": air_bytes,  # measured on the testbed's air (the deployed method only)
        "fl_rounds": c.get("fl_rounds"),
    }


UnlearnFn = Callable[
    [Path, str, str, str, list[str], bool], tuple[dict[str, torch.Tensor], dict[str, Any]]
]


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
        self.clock = getattr(link, "virtual_time", time.monotonic)
        self.signing_key = signing_key or Ed25519PrivateKey.generate()
        self.public_key = public_bytes(self.signing_key)
        self.keys = dict(keys)
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.unlearn_fn = unlearn_fn or default_unlearn
        self.compare_fn = compare_unlearn  # testbed.unlearn.compare: the side-by-side methods
        self._served: tuple[dict[str, Any], Mapping[str, Any], Any] | None = None
        self.on_event = on_event
        self.cfg = self._resolve_config(dict(cfg))
        tb = self.cfg["testbed"]
        self.tb = tb
        self.agg_cfg = AggregationConfig.from_dict(dict(tb.get("aggregation") or {}))
        self.limits = RateLimiter(
            {
                "resync": float(tb.get("resync_min_interval_s", 0.0)),
                "request": float(tb.get("request_min_interval_s", 0.0)),
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
        self.rejections: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.eval_reports: dict[str, dict[int, dict[str, Any]]] = {}
        self.rounds_log: list[dict[str, Any]] = []
        self.closed_rounds: dict[int, set[int]] = {}
        self._forgotten_before: set[int] = set()  # client requests accepted before a restart
        self.t0 = time.monotonic()
        self.group_time: dict[tuple[str, int], float] = {}
        self.bytes_rx = 0
        torch.set_num_threads(max(1, int(self.cfg["fl"]["threads"]) or 1))
        self.setup = build_setup(self.cfg)
        self.model = self.setup.new_model()
        self.history = open_history(self.cfg, self.run_dir, self.model)
        # tensor files carry an authenticated digest under a key only this server holds
        self.history.integrity_key = derive_key(private_bytes(self.signing_key), "history", 0)
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
        self.global_np = to_numpy(self.global_state)
        self.groups = self.history.groups
        self.group_time = {g: 0.0 for g in self._all_groups()}
        self._prev_broadcast = self.global_np

    # -- setup -----------------------------------------------------------------------------

    def _resolve_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Use the run's saved config when resuming; check robot ids against the clients."""
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
        cfg["fl"] = dict(cfg["fl"])
        cfg["fl"]["rounds"] = int(cfg["testbed"]["rounds"])
        n = int(cfg["data"]["num_clients"])
        bad = [r for r in self.keys if not 1 <= r <= n]
        if bad:
            raise ConfigError(f"robot ids {bad} have no FL client (data.num_clients = {n})")
        save_config(cfg, saved)
        return cfg

    def _all_groups(self) -> list[tuple[str, int]]:
        return [(layer, j) for layer, g in self.groups.items() for j in range(len(g))]

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

    def _reload_requests(self) -> None:
        """Unlearning requests accepted before a restart and not yet served are kept."""
        path = self.run_dir / "requests.jsonl"
        served = self.run_dir / "unlearn_served.jsonl"
        done = set(served.read_text().split()) if served.is_file() else set()
        if not path.is_file():
            return
        for line in path.read_text().splitlines():
            try:
                req = json.loads(line)
            except json.JSONDecodeError:
                continue
            if req.get("text") in done:
                continue
            self.requests.append(req)
            if req.get("kind") == "client":
                self._forgotten_before.add(int(req["robot"]))
            log.info(
                "request %s from robot %s kept from before the restart",
                req.get("text"),
                req.get("robot"),
            )

    def _event(self, kind: str, **data: Any) -> None:
        row = {"t": round(time.monotonic() - self.t0, 3), "event": kind, **data}
        self.events.append(row)
        if self.on_event is not None:
            self.on_event(kind, row)

    def _reject(
        self, reason: str, robot: int | None, what: str, detail: str = "", round_: int | None = None
    ) -> None:
        """Log and count a refused message."""
        row = {
            "t": round(time.monotonic() - self.t0, 3),
            "round": round_ if round_ is not None else (self.round.t if self.round else None),
            "robot": robot,
            "message": what,
            "reason": reason,
            "detail": detail[:200],
        }
        self.rejections.append(row)
        with (self.run_dir / "rejections.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        log.warning("rejected %s from robot %s: %s %s", what, robot, reason, detail)

    # -- message handling ------------------------------------------------------------------

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
            max_skew_s=float(self.tb["max_skew_s"]),
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

    def _on_register(self, r: int, meta: Mapping[str, Any]) -> None:
        rm = RegisterMeta.parse(meta)
        nonce, num = rm.nonce, rm.num_samples
        info = self.robots.get(r) or RobotInfo(r)
        if info.last_nonce == nonce:  # the same REGISTER again (retry): acknowledge, keep state
            self._send_register_ack(info, nonce)
            return
        info.last_nonce = nonce
        info.num_samples = num
        info.registered_at = time.monotonic()
        info.registrations += 1
        info.held, info.held_sha = None, None
        info.resync_at = time.monotonic()
        self.robots[r] = info
        expected = self.setup.data_sizes[r - 1]
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
        try:
            ref = rs.global_np if um.delta else None
            state = decode_state(body, reference=ref)
            if ref is not None:  # a delta decodes in the reference's dtypes
                state = cast_like(state, rs.global_np)
        except Exception as exc:
            self._refuse_update(rs, r, t, "malformed_tensors", repr(exc))
            return
        mn = self.tb.get("max_update_norm")
        # dtypes are compared, not cast: a float64 upload of a float32 model is refused
        reason = validate_update(state, rs.global_np, None if mn is None else float(mn))
        if reason is not None:
            self._refuse_update(rs, r, t, reason.split(":")[0], reason)
            return
        rs.updates[r] = state
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
        rs.refused.setdefault(r, time.monotonic())
        self._reject(reason, r, f"UPDATE r{t}", detail, round_=t)
        self._notify_reject(r, t, f"{reason}: {detail}"[:200])

    def _notify_reject(self, r: int, t: int, reason: str) -> None:
        self.ep.send(
            MsgType.REJECT, r, self.keys[r], self.session, t, {"reason": reason}, timeout=10.0
        )

    def _on_unlearn_request(self, robot: RobotInfo, meta: Mapping[str, Any]) -> None:
        r = robot.robot_id
        if not self.limits.allow(r, "request"):
            raise ProtocolError("rate_limited", "UNLEARN_REQUEST more often than allowed")
        target = meta.get("robot")
        if target != r:
            self._reject("not_own_request", r, "UNLEARN_REQUEST", f"asks for robot {target}")
            self._reply_unlearn(r, False, f"only robot {target} may ask to forget its data")
            return
        if robot.forgotten or any(q["robot"] == r for q in self.requests):
            self._reject("duplicate", r, "UNLEARN_REQUEST")
            self._reply_unlearn(r, False, "already requested")
            return
        try:  # refused at once when the run cannot serve it (e.g. class:99)
            UnlearnMeta.parse(meta, int(self.setup.train.num_classes))
            text = unlearn_request_text(meta, r)
        except ProtocolError as exc:
            self._reject(exc.reason, r, "UNLEARN_REQUEST", exc.detail)
            self._reply_unlearn(r, False, exc.detail)
            return
        except (ValueError, TypeError) as exc:
            self._reject("bad_request", r, "UNLEARN_REQUEST", str(exc))
            self._reply_unlearn(r, False, str(exc))
            return
        req = {
            "robot": r,
            "kind": meta.get("kind"),
            "text": text,
            "classes": meta.get("classes"),
            "fraction": meta.get("fraction"),
            "received_s": round(time.monotonic() - self.t0, 3),
        }
        self.requests.append(req)
        with (self.run_dir / "requests.jsonl").open("a") as fh:
            fh.write(json.dumps(req) + "\n")
        if req["kind"] == "client":
            robot.forgotten = True  # it leaves the federation now: no further rounds
            if self.round is not None and r not in self.round.updates:
                self.round.scheduled.discard(r)
        self._reply_unlearn(r, True, "queued: served after the last round")
        self._event("unlearn_request", robot=r, request=text)
        log.info("unlearning request from robot %d accepted: %s", r, text)

    def _reply_unlearn(self, r: int, ok: bool, reason: str) -> None:
        meta: dict[str, Any] = {"accepted": ok, "reason": reason}
        meta["sig"] = sign(
            self.signing_key, "unlearn_ack", session=self.session, robot=r, accepted=ok
        )
        self.ep.send(MsgType.UNLEARN_ACK, r, self.keys[r], self.session, 0, meta, timeout=10.0)

    # -- sending models --------------------------------------------------------------------

    def _send_model(
        self,
        robot: RobotInfo,
        state: dict[str, np.ndarray],
        purpose: str,
        t: int,
        extra: dict[str, Any] | None = None,
        src_sha: str | None = None,
    ) -> Outgoing:
        """Start sending ``state`` to a robot, as a delta against what it holds when allowed."""
        tb = self.tb
        src_sha = src_sha or state_sha256(state)
        ref = robot.held if tb["broadcast"] == "delta" and robot.held is not None else None
        enc = str(tb["broadcast_encoding"])
        G = int(self.cfg["scale"]["groups_per_layer"])
        body = encode_state(state, enc, ref, G)
        # What the robot will hold: decode our own bytes (lossy encodings included).
        held = cast_like(decode_state(body, reference=ref), state)
        sha = state_sha256(held)
        meta = {
            "purpose": purpose,
            "sha256": sha,
            "base_sha256": robot.held_sha if ref is not None else None,
            "deadline_s": max(0.0, (self.round.deadline - self.clock()) if self.round else 0),
            **(extra or {}),
        }
        meta["sig"] = sign(
            self.signing_key,
            "model",
            session=self.session,
            robot=robot.robot_id,
            round=t,
            purpose=purpose,
            sha256=sha,
        )
        h = self.ep.send(
            MsgType.MODEL,
            robot.robot_id,
            self.keys[robot.robot_id],
            self.session,
            t,
            meta,
            body,
            timeout=float(tb["send_timeout_s"]),
        )
        changed = {
            g for g in self._all_groups() if self._group_changed(g, state, self._prev_broadcast)
        }
        out = Outgoing(robot.robot_id, h, held, sha, src_sha, purpose, t, changed)
        self.outgoing.append(out)
        log.info(
            "%s model r%d -> robot %d: %d B (%s)",
            purpose,
            t,
            robot.robot_id,
            len(body),
            "delta" if ref is not None else "full",
        )
        return out

    def _send_model_many(
        self,
        robots: list[RobotInfo],
        state: dict[str, np.ndarray],
        purpose: str,
        t: int,
        extra: dict[str, Any] | None = None,
        src_sha: str | None = None,
    ) -> list[Outgoing]:
        """Send ``state`` to several robots: one broadcast per distinct body over a MAC link.

        ``testbed.downlink``: ``unicast`` sends one model per robot (``_send_model``);
        ``broadcast`` (or ``auto`` on a link that can broadcast: frames-shared) puts each
        distinct body (full, or a delta against a base several robots hold) on air once and
        sends every robot a small sealed MODEL envelope naming the body's SHA-256.
        """
        tb = self.tb
        mode = str(tb.get("downlink", "auto"))
        bcast = getattr(self.link, "broadcast", None)
        if mode == "unicast" or not callable(bcast) or not getattr(self.link, "is_server", False):
            if mode == "broadcast":
                log.warning("testbed.downlink=broadcast but the link cannot broadcast: unicast")
            return [self._send_model(rb, state, purpose, t, extra, src_sha) for rb in robots]
        src_sha = src_sha or state_sha256(state)
        enc = str(tb["broadcast_encoding"])
        G = int(self.cfg["scale"]["groups_per_layer"])
        groups: dict[str | None, list[RobotInfo]] = {}
        for rb in robots:
            delta = tb["broadcast"] == "delta" and rb.held is not None
            groups.setdefault(rb.held_sha if delta else None, []).append(rb)
        changed = {
            g for g in self._all_groups() if self._group_changed(g, state, self._prev_broadcast)
        }
        timeout = float(tb["send_timeout_s"])
        outs: list[Outgoing] = []
        for base, members in groups.items():
            ref = members[0].held if base is not None else None
            body = encode_state(state, enc, ref, G)
            held = cast_like(decode_state(body, reference=ref), state)
            sha = state_sha256(held)
            body_sha, packed = pack_broadcast_body(body)
            bh = bcast(packed, [rb.robot_id for rb in members], timeout=timeout)
            log.info(
                "%s model r%d -> robots %s: %d B once (%s, broadcast)",
                purpose,
                t,
                [rb.robot_id for rb in members],
                len(body),
                "delta" if ref is not None else "full",
            )
            for rb in members:
                meta = {
                    "purpose": purpose,
                    "sha256": sha,
                    "base_sha256": base,
                    "deadline_s": max(
                        0.0, (self.round.deadline - self.clock()) if self.round else 0
                    ),
                    "body_sha256": body_sha,
                    **(extra or {}),
                }
                # signed per robot as in _send_model (robots with the server's public key
                # refused every broadcast model without it: "not signed by the server")
                meta["sig"] = sign(
                    self.signing_key,
                    "model",
                    session=self.session,
                    robot=rb.robot_id,
                    round=t,
                    purpose=purpose,
                    sha256=sha,
                )
                h = self.ep.send(
                    MsgType.MODEL,
                    rb.robot_id,
                    self.keys[rb.robot_id],
                    self.session,
                    t,
                    meta,
                    b"",
                    timeout=timeout,
                )
                joint = JointHandle(h, bh, rb.robot_id)
                out = Outgoing(rb.robot_id, joint, held, sha, src_sha, purpose, t, changed)  # type: ignore[arg-type]
                self.outgoing.append(out)
                outs.append(out)
        return outs

    def _group_changed(
        self, g: tuple[str, int], new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]
    ) -> bool:
        layer, j = g
        a, b = self.groups[layer][j]
        x = new[layer].reshape(-1)[a:b]
        y = old[layer].reshape(-1)[a:b]
        return bool(np.max(np.abs(x.astype(np.float64) - y)) > float(self.history.update_tol))

    def _check_sends(self) -> None:
        """Account finished model sends: what each robot holds, and AoI of the groups."""
        still = []
        for o in self.outgoing:
            if not o.handle.done():
                still.append(o)
                continue
            robot = self.robots.get(o.robot)
            if o.handle.status.value == "delivered":
                if robot is not None and robot.resync_at < o.started:
                    robot.held, robot.held_sha, robot.held_src = o.state, o.sha, o.src_sha
                now = time.monotonic() - self.t0
                for g in o.changed:
                    self.group_time[g] = max(self.group_time.get(g, 0.0), now)
            else:
                log.warning(
                    "%s model r%d to robot %d failed: %s",
                    o.purpose,
                    o.round,
                    o.robot,
                    o.handle.reason,
                )
                if robot is not None:
                    robot.held, robot.held_sha, robot.held_src = None, None, None
        self.outgoing = still

    def aoi_seconds(self) -> float:
        """Mean age (s) over parameter groups of their latest version at the robots."""
        now = time.monotonic() - self.t0
        vals = [now - v for v in self.group_time.values()]
        return float(np.mean(vals)) if vals else 0.0

    def _air_bytes(self) -> int:
        """Bytes the server's ARQ put on the link plus what the robots report for theirs."""
        st = link_stats(self.link).get("arq", {})
        own = int(st.get("bytes_tx", self.ep.sent_bytes))
        return own + sum(r.link_bytes_tx for r in self.robots.values())

    # -- the run ---------------------------------------------------------------------------

    def announce(self) -> None:
        """Tell every robot in the key file the (new) session, so restarted robots re-register."""
        for r, key in self.keys.items():
            self.ep.send(MsgType.SERVER_HELLO, r, key, self.session, 0, {}, timeout=5.0)

    def wait_for_robots(self, n: int, timeout: float) -> bool:
        """Handle messages until ``n`` robots are registered (and not forgotten) or timeout."""
        n = min(n, len(self.keys) - len(self._forgotten_ids()))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(self._active()) >= n:
                return True
            self.poll(0.2)
        return len(self._active()) >= n

    def _active(self) -> list[RobotInfo]:
        return [r for r in self.robots.values() if not r.forgotten]

    def run_round(self, t: int) -> dict[str, Any] | None:
        """Round t: send, collect until all are in or the deadline, aggregate, record."""
        tb = self.tb
        w0 = time.perf_counter()
        bytes0 = self._air_bytes()
        link0 = link_counters(self.link)
        rs = RoundState(t, self.global_np, self.clock() + float(tb["round_deadline_s"]))
        self.round = rs
        src = state_sha256(self.global_np)
        rs.scheduled.update(robot.robot_id for robot in self._active())
        self._send_model_many(self._active(), self.global_np, "train", t, src_sha=src)
        self._prev_broadcast = self.global_np
        self._event("round_start", round=t, scheduled=sorted(rs.scheduled))
        while self.clock() < rs.deadline:
            grace = float(tb.get("refused_grace_s", 0.0))
            waiting = rs.scheduled - self._forgotten_ids() - rs.not_awaited(grace)
            if rs.scheduled and set(rs.updates) >= waiting:
                break
            self.poll(0.2)
            # robots that joined, re-registered or lost their model get it (again)
            for robot in self._active():
                busy = robot.robot_id in rs.updates or robot.robot_id in rs.refused
                if not busy and self._needs(robot, src):
                    rs.scheduled.add(robot.robot_id)
                    self._send_model(robot, self.global_np, "train", t, src_sha=src)
        self.round = None
        self.closed_rounds[t] = set(rs.updates)
        missing = sorted(rs.scheduled - set(rs.updates) - self._forgotten_ids() - set(rs.refused))
        if missing:
            log.warning(
                "round %d closed with robots %s missing (deadline %.0fs)",
                t,
                missing,
                float(tb["round_deadline_s"]),
            )
            self._event("round_missing", round=t, robots=missing)
        if not rs.updates:
            log.warning("round %d: no update accepted", t)
            self._event("round_failed", round=t, reason="no valid update")
            return None
        sizes_all = {r: self.setup.data_sizes[r - 1] for r in rs.updates}
        try:
            res = robust_aggregate(rs.global_np, rs.updates, sizes_all, self.agg_cfg)
        except NoUpdateAcceptedError as exc:
            log.warning("round %d: %s", t, exc)
            self._event("round_failed", round=t, reason=str(exc)[:200])
            for r, why in exc.refused.items():
                self._refuse_update(rs, r, t, why.split(":")[0], why)
            return None
        for r, why in res.refused.items():
            self._refuse_update(rs, r, t, why.split(":")[0], why)
        accepted = sorted(res.accepted)
        clients = [r - 1 for r in accepted]
        sizes = {r - 1: sizes_all[r] for r in accepted}
        states = {r - 1: to_torch(rs.updates[r]) for r in accepted}
        new_global = to_torch(res.state)
        self.model.load_state_dict(new_global)
        ev = evaluate(self.model, self.setup.test, int(self.cfg["fl"]["eval_batch_size"]))
        metrics: dict[str, Any] = {"test_acc": ev["acc"], "test_loss": ev["loss"]}
        if self.setup.triggered_test is not None:
            metrics["asr"] = attack_success_rate(
                self.model, self.setup.triggered_test, self.setup.poison.target_label
            )
        wall = time.perf_counter() - w0
        self.history.record_round(t, clients, sizes, states, new_global, metrics, wall)
        self.global_state = {k: v.clone() for k, v in new_global.items()}
        self.global_np = to_numpy(self.global_state)
        row = {
            "round": t,
            **metrics,
            "participants": [c + 1 for c in clients],
            "missing": missing,
            "rejected": sum(1 for x in self.rejections if x["round"] == t),
            "aggregation": self.agg_cfg.strategy,
            "update_norms": {r: round(v, 6) for r, v in res.norms.items()},
            "air_bytes": self._air_bytes() - bytes0,
            "aoi_s": self.aoi_seconds(),
            "wall_s": wall,
            "train_s": {r: m.get("train_s") for r, m in rs.reported.items()},
        }
        row["link"] = round_link_row(link0, link_counters(self.link), row["air_bytes"])
        self.rounds_log.append(row)
        with (self.run_dir / "rounds.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        self._event("round_end", **{k: row[k] for k in ("round", "test_acc", "participants")})
        log.info(
            "round %d done: acc %.3f, robots %s, %.1fs", t, ev["acc"], row["participants"], wall
        )
        return row

    def _needs(self, robot: RobotInfo, src_sha: str) -> bool:
        """Whether a robot should be sent the state ``src_sha``: it lacks it, none in flight."""
        if any(o.robot == robot.robot_id for o in self.outgoing):
            return False
        return robot.held is None or robot.held_src != src_sha

    def _forgotten_ids(self) -> set[int]:
        return {r.robot_id for r in self.robots.values() if r.forgotten} | self._forgotten_before

    def deploy(
        self, state: dict[str, np.ndarray], purpose: str, extra: dict[str, Any], timeout: float
    ) -> dict[int, dict[str, Any]]:
        """Send a model to every registered robot and collect their evaluation reports."""
        self.eval_reports[purpose] = {}
        targets = list(self.robots.values())
        t = self.history.last_completed_round()
        src = state_sha256(state)
        sends = self._send_model_many(targets, state, purpose, t, extra, src)
        self._prev_broadcast = state
        end = self.clock() + timeout
        want = {o.robot for o in sends}
        while self.clock() < end:
            self.poll(0.2)
            # a robot that registered again (restart) or lost the model gets it (again)
            for rb in self.robots.values():
                if rb.robot_id not in self.eval_reports[purpose] and self._needs(rb, src):
                    want.add(rb.robot_id)
                    self._send_model(rb, state, purpose, t, extra, src)
            if set(self.eval_reports[purpose]) >= want:
                break
        return self.eval_reports[purpose]

    def run(self) -> dict[str, Any]:
        """Rounds, then the unlearning request (if any), deployment, report; returns the report."""
        tb = self.tb
        started = time.monotonic()
        self.announce()
        if not self.wait_for_robots(int(tb["min_robots"]), float(tb["register_timeout_s"])):
            raise RuntimeError(f"fewer than {tb['min_robots']} robots registered in time")
        T = int(tb["rounds"])
        t = self.history.last_completed_round() + 1
        retries = 0
        while t <= T:
            self.wait_for_robots(int(tb["min_robots"]), float(tb["register_timeout_s"]))
            row = self.run_round(t)
            if row is None:  # a failed round is logged and retried; the federation goes on
                retries += 1
                if retries > int(tb["max_round_retries"]):
                    log.error(
                        "round %d failed %d times: training stops after round %d; requests "
                        "are still served and the report written (resume retries round %d)",
                        t,
                        retries,
                        t - 1,
                        t,
                    )
                    self._event("training_stopped", round=t, failures=retries)
                    break
                continue
            retries = 0
            t += 1
        fl_s = time.monotonic() - started
        report: dict[str, Any] = {"rounds": self.rounds_log, "fl_s": fl_s}
        wait_end = time.monotonic() + float(tb["unlearn"]["wait_s"])
        while not self.requests and time.monotonic() < wait_end:
            self.poll(0.2)
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
        un = report.get("unlearning")
        if un is not None and not un.get("error") and self._served is not None:
            try:
                self.after_serving(un)
            except Exception as exc:  # the served request stands; say what did not happen
                log.exception("comparison / erasure after unlearning failed")
                un["after_serving_error"] = repr(exc)
        report.update(self._report_common(time.monotonic() - started))
        return report

    def serve_unlearning(self, req: dict[str, Any]) -> dict[str, Any]:
        """Evaluate the final model on the robots, unlearn, deploy Theta', evaluate again."""
        tb = self.tb
        timeout = float(tb["round_deadline_s"])
        info = {
            "robot": req["robot"],
            "kind": req["kind"],
            "classes": req["classes"],
            "fraction": req["fraction"],
        }
        before_sha = state_sha256(self.global_np)
        before = self.deploy(self.global_np, "before", {"request": info}, timeout)
        self._event("unlearn_start", request=req["text"])
        u = tb["unlearn"]
        t0 = time.perf_counter()
        state, result = self.unlearn_fn(
            self.run_dir,
            req["text"],
            str(u["method"]),
            str(u["mode"]),
            list(u["overrides"]),
            self.progress,
        )
        unlearn_s = time.perf_counter() - t0
        new_np = cast_like(to_numpy(state), self.global_np)
        sha = state_sha256(new_np)
        self._event("unlearn_done", seconds=round(unlearn_s, 2))
        bytes0 = self._air_bytes()
        d0 = time.monotonic()
        after = self.deploy(new_np, "unlearned", {"request": info}, timeout)
        deploy_s = time.monotonic() - d0
        self._check_sends()
        exact = {r: rep.get("sha256") == sha for r, rep in after.items()}
        deploy_air = self._air_bytes() - bytes0
        side = [side_by_side_row(result, deploy_air)]
        # comparison methods and the erasure run after the robots are released (after_serving)
        self._served = (req, result, state)
        with (self.run_dir / "unlearn_served.jsonl").open("a") as fh:
            fh.write(req["text"] + "\n")
        return {
            "request": req,
            "method": u["method"],
            "mode": u["mode"],
            "protocol": result.get("protocol"),
            "unlearn_s": unlearn_s,
            "deploy_s": deploy_s,
            "deploy_air_bytes": deploy_air,
            "side_by_side": side,
            "erasure": None,
            "aoi_after_deploy_s": self.aoi_seconds(),
            "model_sha256": sha,
            "before_sha256": before_sha,
            "bit_exact": exact,
            "robots_before": before,
            "robots_after": after,
            "server_metrics": result.get("metrics"),
            "server_original": result.get("original"),
            "cost": result.get("cost"),
            "aoi": result.get("aoi"),
        }

    def after_serving(self, un: dict[str, Any]) -> None:
        """The same request by ``testbed.unlearn.compare`` (Retrain, the fine-tune control) on
        the history as it was, side by side with the deployed method; then the erasure."""
        assert self._served is not None
        req, result, state = self._served
        u = self.tb["unlearn"]
        for other in [str(m) for m in u.get("compare") or []]:
            if other == str(u["method"]):
                continue
            self._event("unlearn_compare", method=other)
            un["side_by_side"].append(
                side_by_side_row(
                    self.compare_fn(
                        self.run_dir, req["text"], other, list(u["overrides"]), self.progress
                    )
                )
            )
        if u.get("erase", True):
            un["erasure"] = self._erase(req, result, state)
        self._served = None

    def _erase(
        self, req: Mapping[str, Any], result: Mapping[str, Any], state: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Delete the request's targets' stored updates; the history's final model is Theta'.

        The targets are the clients holding forgotten data (the robot's client index for the
        testbed's requests); recorded in the report and in the served result's JSON.
        """
        from scaleflu.unlearn.cli import erase_history

        rq = result.get("request")
        targets = (rq.get("targets") if isinstance(rq, Mapping) else None) or [
            int(req["robot"]) - 1
        ]
        erasure = erase_history(self.history, [int(n) for n in targets], req["text"], state)
        self._event("erased", clients=erasure["clients"], updates=erasure["updates"])
        path = self.run_dir / "unlearn" / "result.json"
        if path.is_file():  # the served result records what was erased
            try:
                data = json.loads(path.read_text())
                data["erasure"] = erasure
                path.write_text(json.dumps(data, indent=2))
            except (OSError, ValueError) as exc:
                log.warning("could not record the erasure in %s: %s", path, exc)
        log.info(
            "erased %d stored updates of client(s) %s from the history (%d bytes)",
            erasure["updates"],
            erasure["clients"],
            erasure["bytes"],
        )
        return erasure

    def finish(self) -> None:
        """Tell every robot the run is over (waits briefly for the BYEs to go out)."""
        hs = [
            self.ep.send(
                MsgType.BYE, r.robot_id, self.keys[r.robot_id], self.session, 0, {}, timeout=5.0
            )
            for r in self.robots.values()
        ]
        for h in hs:
            h.wait(6.0)

    def _report_common(self, total_s: float) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for x in self.rejections:
            reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
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
            "events": self.events,
            "server_link": link_stats(self.link),
            "server_tx_bytes": self.ep.sent_bytes,
            "server_rx_bytes": self.bytes_rx,
            "air_bytes_total": self._air_bytes(),
            "history_rounds": self.history.last_completed_round(),
            "poison": {
                "backdoor_clients": self.cfg["data"]["poison"]["backdoor_clients"],
                "target_label": self.setup.poison.target_label,
            },
        }
