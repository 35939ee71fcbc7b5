"""The edge server's unlearning service: robots' requests, serving them with the method
registry after the last round, deployment of the unlearned model, comparison, erasure and the
erasure receipt.

A robot's request arrives as typed meta (:class:`~scaleflu.testbed.validation.UnlearnMeta`)
and becomes an :class:`~scaleflu.unlearn.request.UnlearnRequest` for the robot's FL client
(:class:`RobotRequest`); that object is what is queued, kept across a restart, and served. The
server serves it on the run it holds in memory (its history store and global model): it
unlearns, deploys the new model, runs the comparison methods on the history as it was, erases
the request's stored updates, signs an erasure receipt (:mod:`scaleflu.unlearn.receipt`), keeps
it in the history and sends it to the robot that asked (``RECEIPT``), before the next request
and before the robots are released.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scaleflu.fl.integrity import save_model
from scaleflu.fl.run import LoadedRun, append_jsonl
from scaleflu.log import fmt
from scaleflu.testbed.common import arrays, wait_on_clock
from scaleflu.testbed.downlink import Downlink
from scaleflu.testbed.protocol import MsgType, ProtocolError, client_of, state_sha256
from scaleflu.testbed.records import Records
from scaleflu.testbed.sessions import RobotInfo, Sessions
from scaleflu.testbed.validation import UNLEARN_KINDS, EvalMeta, UnlearnMeta
from scaleflu.unlearn.outputs import erase_history, write_unlearning
from scaleflu.unlearn.receipt import (
    RECEIPT_VERSION,
    changed_parts,
    issue_receipt,
    receipt_sha256,
    receipt_text,
)
from scaleflu.unlearn.request import RequestError, UnlearnRequest
from scaleflu.unlearn.run import run_unlearning

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]

__all__ = [
    "UNLEARN_KINDS",
    "CompareFn",
    "RobotRequest",
    "UnlearnFn",
    "UnlearningService",
    "compare_unlearn",
    "default_unlearn",
    "side_by_side_row",
]


@dataclass(frozen=True)
class RobotRequest:
    """An accepted request: the robot that asked, the request for its FL client, and when
    (seconds since the server started)."""

    robot: int
    request: UnlearnRequest
    received_s: float = 0.0

    @classmethod
    def of(cls, meta: UnlearnMeta, received_s: float = 0.0) -> RobotRequest:
        """The request of a robot's checked meta (its own data: its FL client, ``client_of``)."""
        req = UnlearnRequest(meta.kind, (client_of(meta.robot),), meta.classes or (), meta.fraction)
        return cls(meta.robot, req, received_s)

    @property
    def text(self) -> str:
        """The request's text form (``client:0``, ``class:1,4@0``, ``sample:1:0.25``)."""
        return self.request.text

    def to_json(self) -> dict[str, Any]:
        """The row of ``requests.jsonl`` (and the report's ``request``)."""
        r = self.request
        return {
            "robot": self.robot,
            "kind": r.kind,
            "text": r.text,
            "classes": list(r.classes) if r.kind == "class" else None,
            "fraction": r.fraction,
            "received_s": self.received_s,
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RobotRequest:
        """A row of ``requests.jsonl`` (RequestError, KeyError, TypeError or ValueError when it
        is not one)."""
        robot = int(row["robot"])
        classes = tuple(int(c) for c in row.get("classes") or ())
        fraction = None if row.get("fraction") is None else float(row["fraction"])
        req = UnlearnRequest(str(row["kind"]), (client_of(robot),), classes, fraction)
        return cls(robot, req, float(row.get("received_s") or 0.0))


def default_unlearn(
    run: LoadedRun,
    request: UnlearnRequest,
    method: str,
    mode: str,
    overrides: list[str],
    progress: bool,
) -> tuple[State, dict[str, Any]]:
    """Unlearn on the run the server holds (the method registry, in memory): (state, result)."""
    done = run_unlearning(
        run.run_dir, request, method, mode, overrides=list(overrides), progress=progress, run=run
    )
    return done.state, done.result.to_dict()


def compare_unlearn(
    run: LoadedRun, request: UnlearnRequest, method: str, overrides: list[str], progress: bool
) -> dict[str, Any]:
    """Run another method on the same request for the side-by-side table (not deployed).

    The method registry's in-memory run; its outputs are also written to
    ``run_dir/unlearn_compare/<method>``. Returns its result dict, or ``{"method", "error"}``
    when the method cannot run (e.g. not in this build).
    """
    out = Path(run.run_dir) / "unlearn_compare" / method
    try:
        done = run_unlearning(
            run.run_dir, request, method, overrides=list(overrides), progress=progress, run=run
        )
        write_unlearning(done, request.text, method, out)
    except (ValueError, KeyError, ImportError) as exc:
        log.warning("comparison method %s on %s not run: %s", method, request.text, exc)
        return {"method": method, "error": str(exc)}
    return done.result.to_dict()


def side_by_side_row(result: Mapping[str, Any], air_bytes: int | None = None) -> dict[str, Any]:
    """One method's row of the side-by-side table from its result dict."""
    if result.get("error"):
        return {"method": result.get("method"), "error": result["error"]}
    m = result.get("metrics") or {}
    c = result.get("cost") or {}
    mia, mia_kind = m.get("mia_loss_auc"), "loss"
    for key in ("mia_ref_auc", "mia_auc"):  # the calibrated audit where it exists
        if m.get(key) is not None:
            mia, mia_kind = m[key], "calibrated"
            break
    return {
        "method": result.get("method"),
        "asr": m.get("backdoor_asr"),
        "test_acc": m.get("test_acc"),
        "ra": m.get("ra"),
        "fa": m.get("fa_protocol"),
        "mia_auc": mia,
        # the per-example membership audit (scale.eval.audit; None when off)
        "audit_set": m.get("audit_set"),
        "audit_auc": m.get("audit_auc"),
        "audit_auc_lo": m.get("audit_auc_lo"),
        "audit_auc_hi": m.get("audit_auc_hi"),
        "audit_tpr_1fpr": m.get("audit_tpr_1fpr"),
        "audit_tpr_01fpr": m.get("audit_tpr_01fpr"),
        "mia_kind": mia_kind if mia is not None else None,
        "wall_s": c.get("wall_s"),
        "cpu_s": c.get("cpu_s"),
        "startup_s": (result.get("details") or {}).get("startup_s"),
        "link_bytes": c.get("bytes"),  # the method's own FL traffic on the simulated link
        "air_bytes": air_bytes,  # measured on the testbed's air (the deployed method only)
        "fl_rounds": c.get("fl_rounds"),
    }


UnlearnFn = Callable[
    [LoadedRun, UnlearnRequest, str, str, list[str], bool], tuple[State, dict[str, Any]]
]
CompareFn = Callable[[LoadedRun, UnlearnRequest, str, list[str], bool], dict[str, Any]]


class UnlearningService:
    """Robots' unlearning requests and their service.

    Owns the queue of accepted requests (``requests.jsonl``, kept across a restart), the
    robots' evaluation reports of deployed models, and the request being served.
    ``history``: the server's history store; ``held_run``: the run the server holds (that
    history, its data and its current global model);
    ``unlearn_fn``: the method that serves (default: the registry, ``testbed.unlearn``);
    ``compare_fn``: the side-by-side methods (``testbed.unlearn.compare``).
    """

    def __init__(
        self,
        sessions: Sessions,
        downlink: Downlink,
        records: Records,
        history: Any,
        held_run: Callable[[], LoadedRun],
        tb: Any,
        run_dir: Path,
        clock: Callable[[], float],
        poll: Callable[[float], None],
        num_classes: int,
        unlearn_fn: UnlearnFn | None = None,
        compare_fn: CompareFn | None = None,
        progress: bool = True,
    ) -> None:
        self.sessions = sessions
        self.downlink = downlink
        self.records = records
        self.history = history
        self.held_run = held_run
        self.tb = tb
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.poll = poll
        self.num_classes = int(num_classes)
        self.unlearn_fn: UnlearnFn = unlearn_fn or default_unlearn
        self.compare_fn: CompareFn = compare_fn or compare_unlearn
        self.progress = progress
        self.requests: list[RobotRequest] = []
        self.eval_reports: dict[str, dict[int, dict[str, Any]]] = {}

    def reload(self) -> None:
        """Requests accepted before a restart and not yet served are kept (a client request's
        robot stays forgotten)."""
        path = self.run_dir / "requests.jsonl"
        served = self.run_dir / "unlearn_served.jsonl"
        done = set(served.read_text().split()) if served.is_file() else set()
        if not path.is_file():
            return
        for i, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
                if row.get("text") in done:
                    continue
                req = RobotRequest.from_json(row)
            except json.JSONDecodeError:  # a line cut by a crash
                continue
            except (RequestError, KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("%s line %d is not a request, skipped: %s", path, i, exc)
                continue
            self.requests.append(req)
            if req.request.kind == "client":
                self.sessions.forget(req.robot, before_restart=True)
            log.info("request %s from robot %d kept from before the restart", req.text, req.robot)

    # -- messages -------------------------------------------------------------------------

    def on_request(self, robot: RobotInfo, meta: Mapping[str, Any]) -> None:
        """An UNLEARN_REQUEST: checked, queued (served after the last round), acknowledged."""
        r = robot.robot_id
        target = meta.get("robot")
        if target != r:
            self.records.reject("not_own_request", r, "UNLEARN_REQUEST", f"asks for robot {target}")
            self._reply(r, False, f"only robot {target} may ask to forget its data")
            return
        if robot.forgotten or any(q.robot == r for q in self.requests):
            self.records.reject("duplicate", r, "UNLEARN_REQUEST")
            self._reply(r, False, "already requested")
            return
        try:  # refused at once when the run cannot serve it (e.g. class:99)
            req = RobotRequest.of(UnlearnMeta.parse(meta, self.num_classes), self.records.elapsed())
        except ProtocolError as exc:
            self.records.reject(exc.reason, r, "UNLEARN_REQUEST", exc.detail)
            self._reply(r, False, exc.detail)
            return
        except (RequestError, ValueError, TypeError) as exc:
            self.records.reject("bad_request", r, "UNLEARN_REQUEST", str(exc))
            self._reply(r, False, str(exc))
            return
        self.requests.append(req)
        append_jsonl(self.run_dir / "requests.jsonl", req.to_json())
        if req.request.kind == "client":
            self.sessions.forget(r)  # it leaves the federation now: no further rounds
        self._reply(r, True, "queued: served after the last round")
        self.records.event("unlearn_request", robot=r, request=req.text)
        log.info("unlearning request from robot %d accepted: %s", r, req.text)

    def _reply(self, r: int, ok: bool, reason: str) -> None:
        meta: dict[str, Any] = {"accepted": ok, "reason": reason}
        meta["sig"] = self.sessions.sign("unlearn_ack", r, accepted=ok)
        # an answer to the robot's request: charged to its airtime (not sent when throttled)
        self.sessions.answer(MsgType.UNLEARN_ACK, r, "UNLEARN_REQUEST", 0, meta, timeout=10.0)

    def on_eval_report(self, robot: RobotInfo, meta: Mapping[str, Any]) -> None:
        """An EVAL_REPORT: a robot's metrics of a deployed model, kept for the report."""
        em = EvalMeta.parse(meta)
        self.eval_reports.setdefault(em.purpose, {})[robot.robot_id] = dict(meta)
        robot.link_bytes_tx = em.link_bytes_tx
        log.info("robot %d evaluated the %s model: %s", robot.robot_id, em.purpose, fmt(em.metrics))

    # -- serving --------------------------------------------------------------------------

    def deploy(
        self, state: State, purpose: str, extra: dict[str, Any], timeout: float
    ) -> dict[int, dict[str, Any]]:
        """Send a model to every registered robot and collect their evaluation reports."""
        self.eval_reports[purpose] = {}
        t = self.history.last_completed_round()
        src = state_sha256(arrays(state))
        sends = self.downlink.send_many(list(self.sessions.robots), state, purpose, t, extra, src)
        end = self.clock() + timeout
        want = {o.robot for o in sends}
        while self.clock() < end:
            self.poll(0.2)
            # a robot that registered again (restart) or lost the model gets it (again)
            for r in self.sessions.robots:
                if r not in self.eval_reports[purpose] and self.downlink.needs(r, src):
                    want.add(r)
                    self.downlink.send(r, state, purpose, t, extra, src)
            if set(self.eval_reports[purpose]) >= want:
                break
        return self.eval_reports[purpose]

    def serve(self, req: RobotRequest) -> dict[str, Any]:
        """Evaluate the final model on the robots, unlearn, deploy Theta', evaluate again."""
        tb = self.tb
        timeout = float(tb.round_deadline_s)
        info = {
            "robot": req.robot,
            "kind": req.request.kind,
            "classes": list(req.request.classes) if req.request.kind == "class" else None,
            "fraction": req.request.fraction,
        }
        run = self.held_run()
        current = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        before_sha = state_sha256(arrays(current))
        before = self.deploy(current, "before", {"request": info}, timeout)
        self.records.event("unlearn_start", request=req.text)
        u = tb.unlearn
        t0 = time.perf_counter()
        state, result = self.unlearn_fn(
            run, req.request, str(u.method), str(u.mode), list(u.overrides), self.progress
        )
        unlearn_s = time.perf_counter() - t0
        # in the global model's dtypes, on the CPU
        new = {k: v.detach().to("cpu", current[k].dtype) for k, v in state.items()}
        sha = state_sha256(arrays(new))
        # the served model, with the server's authenticated digest (checked by load_model)
        model_path = save_model(new, self.run_dir / "unlearned" / f"model-{sha[:16]}.safetensors")
        self.records.event("unlearn_done", seconds=round(unlearn_s, 2))
        bytes0 = self.downlink.air_bytes()
        d0 = time.monotonic()
        after = self.deploy(new, "unlearned", {"request": info}, timeout)
        deploy_s = time.monotonic() - d0
        self.downlink.check_sends()
        exact = {r: rep.get("sha256") == sha for r, rep in after.items()}
        deploy_air = self.downlink.air_bytes() - bytes0
        side = [side_by_side_row(result, deploy_air)]
        out: dict[str, Any] = {
            "request": req.to_json(),
            "method": u.method,
            "mode": u.mode,
            "protocol": result.get("protocol"),
            "unlearn_s": unlearn_s,
            "deploy_s": deploy_s,
            "deploy_air_bytes": deploy_air,
            "side_by_side": side,
            "erasure": None,
            "receipt": None,
            "aoi_after_deploy_s": self.downlink.aoi_seconds(),
            "model_sha256": sha,
            "model_path": str(model_path),
            "before_sha256": before_sha,
            "bit_exact": exact,
            "robots_before": before,
            "robots_after": after,
            "server_metrics": result.get("metrics"),
            "server_original": result.get("original"),
            "cost": result.get("cost"),
            "aoi": result.get("aoi"),
        }
        # the comparison methods on the history as it was, then the erasure and the receipt:
        # the robot that asked gets its receipt before the robots are released
        try:
            for other in [str(m) for m in u.get("compare") or []]:
                if other == str(u.method):
                    continue
                self.records.event("unlearn_compare", method=other)
                row = self.compare_fn(run, req.request, other, list(u.overrides), self.progress)
                side.append(side_by_side_row(row))
            erasure = None
            if u.get("erase", True):
                erasure = out["erasure"] = self._erase(req, result, new)
            out["receipt"] = self._receipt(req, result, current, new, before_sha, sha, erasure)
        except Exception as exc:  # the served request stands; say what did not happen
            log.exception("comparison / erasure / receipt after unlearning %s failed", req.text)
            out["after_serving_error"] = repr(exc)
        # served: a restart does not serve it again (one that died before this line does)
        with (self.run_dir / "unlearn_served.jsonl").open("a") as fh:
            fh.write(req.text + "\n")
        return out

    def _receipt(
        self,
        req: RobotRequest,
        result: Mapping[str, Any],
        before: State,
        after: State,
        before_sha: str,
        after_sha: str,
        erasure: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """Sign the request's erasure receipt, keep it in the history and in ``receipts/``,
        and send it to the robot that asked (``RECEIPT``); what became of it."""
        u = self.tb.unlearn
        rq = result.get("request")
        targets = (rq.get("targets") if isinstance(rq, Mapping) else None) or list(
            req.request.clients
        )
        request = {**req.to_json(), "targets": [int(n) for n in targets]}
        request.pop("received_s", None)
        receipt = issue_receipt(
            self.history,
            self.sessions.signing_key,
            request=request,
            method=str(result.get("method") or u.method),
            mode=str(u.mode) if str(u.method) == "scale" else None,
            before_sha256=before_sha,
            after_sha256=after_sha,
            changed=changed_parts(before, after, self.history.groups),
            erasure=erasure,
            result=result,
        )
        text = receipt_text(receipt)
        seq = len(self.history.receipts())
        path = self.run_dir / "receipts" / f"{seq:04d}-{req.request.slug}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        body = text.encode()
        meta = {"receipt_version": RECEIPT_VERSION, "request": req.text}
        handle = self.sessions.send(
            MsgType.RECEIPT, req.robot, 0, meta, body, timeout=float(self.tb.send_timeout_s)
        )
        delivered = wait_on_clock(handle, float(self.tb.send_timeout_s) + 1.0, self.clock)
        status = handle.status.value if delivered else "pending"
        self.records.event("receipt", robot=req.robot, request=req.text, status=status)
        log.info(
            "erasure receipt %d for %s signed (history version %d), sent to robot %d: %s",
            seq,
            req.text,
            receipt["history"]["version"],
            req.robot,
            status,
        )
        return {
            "seq": seq,
            "path": str(path),
            "sha256": receipt_sha256(receipt),
            "history_version": receipt["history"]["version"],
            "sent_to": req.robot,
            "status": status,
        }

    def _erase(self, req: RobotRequest, result: Mapping[str, Any], state: State) -> dict[str, Any]:
        """Delete the request's targets' stored updates; the history's final model is Theta'
        (the served model, in the global model's dtypes).

        The targets are the clients holding forgotten data (the robot's client index for the
        testbed's requests); recorded in the report and in the served result's JSON.
        """
        rq = result.get("request")
        targets = (rq.get("targets") if isinstance(rq, Mapping) else None) or list(
            req.request.clients
        )
        erasure = erase_history(self.history, [int(n) for n in targets], req.text, state)
        self.records.event("erased", clients=erasure["clients"], updates=erasure["updates"])
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
