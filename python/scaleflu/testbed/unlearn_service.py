"""The edge server's unlearning service: robots' requests, serving them with the method
registry after the last round, deployment of the unlearned model, comparison and erasure.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from scaleflu.fl.integrity import save_model
from scaleflu.fl.run import append_jsonl
from scaleflu.testbed.common import arrays
from scaleflu.testbed.keys import sign
from scaleflu.testbed.protocol import (
    MsgType,
    ProtocolError,
    client_of,
    state_sha256,
)
from scaleflu.testbed.sessions import RobotInfo
from scaleflu.testbed.validation import UnlearnMeta

log = logging.getLogger(__name__)


UNLEARN_KINDS = ("client", "class", "sample")


def unlearn_request_text(meta: Mapping[str, Any], robot: int) -> str:
    """The scaleflu.unlearn request text for a robot's request (its FL client: client_of)."""
    kind = meta.get("kind")
    n = client_of(robot)
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

    The method registry's in-memory run; its outputs are also written to
    ``run_dir/unlearn_compare/<method>``. Returns its result dict, or ``{"method", "error"}``
    when the method cannot run (e.g. not in this build).
    """
    from scaleflu.unlearn.outputs import write_unlearning
    from scaleflu.unlearn.registry import run_unlearning

    try:
        done = run_unlearning(
            run_dir, request, method, overrides=list(overrides), progress=progress
        )
        write_unlearning(done, request, method, Path(run_dir) / "unlearn_compare" / method)
    except (ValueError, KeyError, ImportError) as exc:
        log.warning("comparison method %s on %s not run: %s", method, request, exc)
        return {"method": method, "error": str(exc)}
    return done.result.to_dict()


def side_by_side_row(result: Mapping[str, Any], air_bytes: int | None = None) -> dict[str, Any]:
    """One method's row of the side-by-side table from its result dict."""
    if result.get("error"):
        return {"method": result.get("method"), "error": result["error"]}
    m = result.get("metrics") or {}
    c = result.get("cost") or {}
    mia = m.get("mia_loss_auc")
    for key in ("mia_ref_auc", "mia_auc"):  # the calibrated audit where it exists
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


class UnlearningMixin:
    """Unlearning requests and their service in an :class:`EdgeServer`."""

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
        append_jsonl(self.run_dir / "requests.jsonl", req)
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

    def serve_unlearning(self, req: dict[str, Any]) -> dict[str, Any]:
        """Evaluate the final model on the robots, unlearn, deploy Theta', evaluate again."""
        tb = self.tb
        timeout = float(tb.round_deadline_s)
        info = {
            "robot": req["robot"],
            "kind": req["kind"],
            "classes": req["classes"],
            "fraction": req["fraction"],
        }
        before_sha = state_sha256(arrays(self.global_state))
        before = self.deploy(self.global_state, "before", {"request": info}, timeout)
        self._event("unlearn_start", request=req["text"])
        u = tb.unlearn
        t0 = time.perf_counter()
        state, result = self.unlearn_fn(
            self.run_dir,
            req["text"],
            str(u.method),
            str(u.mode),
            list(u.overrides),
            self.progress,
        )
        unlearn_s = time.perf_counter() - t0
        # in the global model's dtypes, on the CPU
        new = {k: v.detach().to("cpu", self.global_state[k].dtype) for k, v in state.items()}
        sha = state_sha256(arrays(new))
        # the served model, with the server's authenticated digest (checked by load_model)
        model_path = save_model(new, self.run_dir / "unlearned" / f"model-{sha[:16]}.safetensors")
        self._event("unlearn_done", seconds=round(unlearn_s, 2))
        bytes0 = self._air_bytes()
        d0 = time.monotonic()
        after = self.deploy(new, "unlearned", {"request": info}, timeout)
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
            "method": u.method,
            "mode": u.mode,
            "protocol": result.get("protocol"),
            "unlearn_s": unlearn_s,
            "deploy_s": deploy_s,
            "deploy_air_bytes": deploy_air,
            "side_by_side": side,
            "erasure": None,
            "aoi_after_deploy_s": self.aoi_seconds(),
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

    def after_serving(self, un: dict[str, Any]) -> None:
        """The same request by ``testbed.unlearn.compare`` (Retrain, the fine-tune control) on
        the history as it was, side by side with the deployed method; then the erasure."""
        assert self._served is not None
        req, result, state = self._served
        u = self.tb.unlearn
        for other in [str(m) for m in u.get("compare") or []]:
            if other == str(u.method):
                continue
            self._event("unlearn_compare", method=other)
            un["side_by_side"].append(
                side_by_side_row(
                    self.compare_fn(
                        self.run_dir, req["text"], other, list(u.overrides), self.progress
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
        from scaleflu.unlearn.outputs import erase_history

        rq = result.get("request")
        targets = (rq.get("targets") if isinstance(rq, Mapping) else None) or [
            client_of(req["robot"])
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
