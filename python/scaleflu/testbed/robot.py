"""Robot client: registers, trains on its own partition when a model comes, reports evaluations.

The robot holds only its own partition of the training set (rebuilt from the shared seeded
config, poisoned as the evaluation protocol says) and a local test slice. Local training is the
FL runtime's ``train_client`` (the same SGD, seeds and batches as the simulation). Every message
it accepts is authenticated with its pre-shared key and replay-checked; it re-registers when the
server announces a new session (restart) or stays silent for ``testbed.robot_idle_s``. Every
wait on the server (that silence, registration retries, an upload's verdict, the round's time
left) runs on the link's clock (``common.link_clock``: the shared medium's virtual time on
``ofdm-shared``), so a medium that runs slower than the wall does not make a robot give up on a
live server.

``faults`` makes the robot misbehave on purpose, for tests and demos of the server's
defences: a hook object (:class:`~scaleflu.testbed.faults.RobotFaults`) consulted before
training and around the upload; the robot's own path below is the honest one.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaleflu.config import as_config
from scaleflu.fl.data import ImageData, add_trigger
from scaleflu.fl.device import infer
from scaleflu.fl.fedavg import LocalConfig, derive_seed, evaluate, train_client
from scaleflu.fl.models import build_model
from scaleflu.fl.run import build_data
from scaleflu.link import Link
from scaleflu.link.mcs import MCS_TABLE_VERSION
from scaleflu.log import fmt
from scaleflu.testbed.common import (
    Endpoint,
    LinkDeadline,
    arrays,
    cast_like,
    decode_state,
    encode_state,
    federation_config,
    install_link_keys,
    link_clock,
    tensors,
    wait_on_clock,
)
from scaleflu.testbed.faults import NO_FAULTS, RobotFaults
from scaleflu.testbed.keys import check_robot_key, verify
from scaleflu.testbed.protocol import (
    SERVER_ID,
    MsgType,
    ProtocolError,
    ReplayGuard,
    client_of,
    open_envelope,
    peek,
    state_sha256,
)
from scaleflu.testbed.transport import BodyCache, link_stats, unpack_broadcast_body
from scaleflu.unlearn.receipt import (
    RECEIPT_VERSION,
    ReceiptError,
    parse_receipt,
    receipt_text,
    verify_receipt,
)

log = logging.getLogger(__name__)


class RobotData:
    """A robot's own data: its partition (as poisoned by the protocol) and a local test slice."""

    def __init__(self, cfg: Mapping[str, Any], robot_id: int) -> None:
        """Rebuild the seeded split from ``cfg`` and keep only this robot's samples."""
        cfg = as_config(cfg)
        seed = int(cfg.seed)
        n = client_of(robot_id)
        # the server's builder: the same partition, poisoning and canaries as FL training
        clean, train, test, parts, poison = build_data(cfg)
        self.part = parts[n]
        self.train: ImageData = train.subset(self.part)
        self.clean: ImageData = clean.subset(self.part)
        self.target_label = poison.target_label
        self.trigger_size = poison.trigger_size
        self.backdoor = np.isin(self.part, poison.backdoor_indices)  # positions in own data
        self.flipped = np.isin(self.part, poison.flipped_indices)
        k = min(int(cfg.testbed.eval_test_samples), len(test))
        rng = np.random.default_rng(np.random.SeedSequence([seed, 77, robot_id]))
        self.test: ImageData = test.subset(np.sort(rng.choice(len(test), k, replace=False)))
        keep = torch.nonzero(self.test.labels != self.target_label).flatten().numpy()
        self.triggered: ImageData = self.test.subset(keep)
        self.triggered.pixels = add_trigger(self.triggered.pixels, self.trigger_size)
        self.num_classes = train.num_classes
        self.model_args = (
            str(cfg.model.name),
            train.num_classes,
            train.in_channels,
            train.image_size,
        )
        del clean, test, parts, train

    def __len__(self) -> int:
        return len(self.train)


@torch.no_grad()
def _acc(model: torch.nn.Module, data: ImageData, idx: np.ndarray, labels: torch.Tensor) -> float:
    if len(idx) == 0:
        return float("nan")
    model.eval()
    sel = torch.as_tensor(idx, dtype=torch.int64)
    out = infer(model, data.inputs(sel))
    return float((out.argmax(1) == labels[sel]).float().mean())


def robot_metrics(
    model: torch.nn.Module, data: RobotData, request: Mapping[str, Any] | None, robot_id: int
) -> dict[str, Any]:
    """RA/FA on the robot's own data (per the request's protocol), test accuracy and ASR."""
    n = len(data)
    allpos = np.arange(n)
    mine = bool(request) and int(request.get("robot", -1)) == robot_id
    kind = request.get("kind") if request else None
    poisoned = data.backdoor | data.flipped
    forget = np.zeros(n, dtype=bool)
    if mine and kind == "client":
        forget[:] = True
    elif mine and kind == "class":
        forget = np.isin(data.clean.labels.numpy(), [int(c) for c in request.get("classes", [])])
    elif mine and kind == "sample":
        k = int(round(float(request.get("fraction", 0.0)) * n))
        order = np.concatenate([allpos[poisoned], allpos[~poisoned]])
        forget[order[:k]] = True
    out: dict[str, Any] = {"num_samples": n, "forget_samples": int(forget.sum())}
    remain = allpos[~forget]
    out["ra"] = _acc(model, data.train, remain, data.train.labels)
    if mine:
        bd = allpos[forget & data.backdoor]
        bd = bd[data.clean.labels.numpy()[bd] != data.target_label]
        if len(bd) and kind != "class":  # backdoor: attack success on its triggered samples
            out["fa_protocol"] = "backdoor"
            out["fa"] = _acc(
                model, data.train, bd, torch.full_like(data.train.labels, data.target_label)
            )
            out["fa_clean"] = _acc(model, data.clean, allpos[forget], data.clean.labels)
        else:  # clean / class protocol: accuracy on the forgotten samples as labelled
            out["fa_protocol"] = "class" if kind == "class" else "clean"
            out["fa"] = _acc(model, data.train, allpos[forget], data.train.labels)
    out["test_acc"] = evaluate(model, data.test)["acc"]
    model.eval()
    pred = infer(model, data.triggered.inputs()).argmax(1)
    out["asr"] = float((pred == data.target_label).float().mean()) if len(data.triggered) else None
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}


class RobotClient:
    """The robot application (see the module docstring)."""

    def __init__(
        self,
        link: Link,
        robot_id: int,
        key: bytes,
        cfg: Mapping[str, Any],
        unlearn: Mapping[str, Any] | None = None,
        unlearn_after_round: int | None = None,
        faults: tuple[str, ...] | RobotFaults = (),
        fault_round: int = 1,
        forge_as: int | None = None,
        data: RobotData | None = None,
        server_public_key: bytes | None = None,
        receipts_dir: str | Path | None = None,
    ) -> None:
        """``unlearn``: request meta (kind, classes, fraction), sent after that round.

        ``faults``: names of :data:`~scaleflu.testbed.faults.FAULTS` (striking in round
        ``fault_round``; ``forge_as``: the robot a forged upload claims to be) or a
        :class:`~scaleflu.testbed.faults.RobotFaults`. ``server_public_key``: the server's
        Ed25519 key from the robot's enrolment file; models and grants without the server's
        signature are then refused (None: not checked). ``receipts_dir``: where the erasure
        receipts of this robot's requests are kept once checked (None: in the summary only).
        """
        if not isinstance(faults, RobotFaults):
            faults = RobotFaults(tuple(faults), fault_round, forge_as) if faults else NO_FAULTS
        self.faults = faults
        self.link = link
        self.clock = link_clock(link)  # every wait on the server runs on the link's clock
        self.robot_id = robot_id
        self.key = check_robot_key(robot_id, key)  # weak keys refused, with the fix
        self.cfg = cfg = federation_config(cfg)  # fl.rounds as on the server: the lr schedule
        self.tb = cfg.testbed
        self.unlearn = dict(unlearn) if unlearn else None
        self.unlearn_after_round = unlearn_after_round
        self.ep = Endpoint(link, robot_id)
        self._bodies = BodyCache()  # model bodies from the broadcast downlink, by SHA-256
        self._waiting_body: dict[str, tuple[int, Mapping[str, Any], bytes]] = {}
        install_link_keys(link, {robot_id: key}, robot_id, self.tb.arq.require_auth is not False)
        self.guard = ReplayGuard()
        self.session: int | None = None
        self.keys = {robot_id: key}
        self.server_public_key = server_public_key
        if server_public_key is None:
            log.warning("robot %d: no server public key; model signatures unchecked", robot_id)
        fl = cfg.fl
        torch.set_num_threads(max(1, int(fl.threads) or 1))
        self.local = LocalConfig.from_config(fl)  # batch_size null: full batch, as in train()
        self.seed = int(cfg.seed)
        t0 = time.perf_counter()
        self.data = data or RobotData(cfg, robot_id)
        self.load_s = time.perf_counter() - t0
        torch.manual_seed(derive_seed(self.seed, 0))
        self.model = build_model(*self.data.model_args)
        self.state: dict[str, np.ndarray] | None = None
        self.state_sha: str | None = None
        self.rounds: list[dict[str, Any]] = []
        self.evals: dict[str, dict[str, Any]] = {}
        self.rejects: list[dict[str, Any]] = []
        self.unlearn_ack: dict[str, Any] | None = None
        self.receipts: list[dict[str, Any]] = []  # erasure receipts, checked
        self.receipt_checks: list[dict[str, Any]] = []  # what was checked of each
        self.receipts_dir = Path(receipts_dir) if receipts_dir is not None else None
        # the highest history version of the server's receipts held, per history store: a
        # receipt of a lower version means the server's history went back
        self.heads: dict[str, int] = {}
        self.registrations = 0
        self.refused: str | None = None  # why the server (or this robot) refused registration
        self.reregistrations = 0  # registrations after robot_idle_s of server silence
        self.done = False
        self._wall_deadline: float | None = None  # run(max_runtime): the operator's bound
        self._pending_nonce: str | None = None
        self._challenge: int | None = None  # the session the server announced (SERVER_HELLO)
        self._early_model: Any = None  # a MODEL that came before our REGISTER_ACK
        # round -> (SHA-256 of the model trained, the server's send_id, upload handle): the
        # same send again (a broadcast envelope after its unicast fall-back, which keeps the
        # broadcast's send_id) does not train the round twice; a round retried is a new send
        self._uploads: dict[int, tuple[str, Any, Any]] = {}
        self._last_heard = self.clock()
        self._requested = False

    # -- registration ----------------------------------------------------------------------

    def _send_register(self, timeout: float) -> None:
        """REGISTER under the server's challenge (its announced session); 0 asks for one."""
        meta = {
            "nonce": self._pending_nonce,
            "num_samples": len(self.data),
            "model": self.data.model_args[0],
            "version": 2,
            "mcs_table": MCS_TABLE_VERSION,  # the server refuses another table version
        }
        s = self._challenge or 0
        self.ep.send(MsgType.REGISTER, SERVER_ID, self.key, s, 0, meta, timeout=timeout)

    def register(self, timeout: float = 60.0) -> bool:
        """Send REGISTER until a REGISTER_ACK with our nonce arrives (or ``timeout``).

        Registration answers the server's challenge: the REGISTER carries the session the
        server announced in its SERVER_HELLO (fresh per server start). Without one the robot
        sends session 0, which the server answers with a SERVER_HELLO only.
        """
        # on the link's clock: on ofdm-shared the medium's virtual time, which runs slower than
        # the wall while it is busy (retrying on wall time re-registered)
        clock = self.clock
        end = LinkDeadline(timeout, clock)
        wait = 1.0
        # one nonce per registration: a retry repeats it, and the server acknowledges a repeated
        # nonce without registering again (a new nonce per retry registered a robot twice when
        # its REGISTER_ACK was slow on the medium: the server reset what it held, sent the
        # model again and the robot trained the round twice)
        nonce = secrets.token_hex(8)
        while not end.expired() and not self.done and not self.out_of_time():
            self._pending_nonce = nonce
            self._send_register(wait * 4)
            until = LinkDeadline(wait * 4, clock)
            while (
                not until.expired() and self._pending_nonce is not None and not self.out_of_time()
            ):
                self.poll(0.2)
            if self._pending_nonce is None:
                return True
            wait = min(wait * 2, 8.0)
            log.info(
                "robot %d: no REGISTER_ACK from the edge server (node %d) yet; retrying (is the "
                "server running, on the same link and key store?)",
                self.robot_id,
                SERVER_ID,
            )
        return False

    def out_of_time(self) -> bool:
        """Whether ``run``'s ``max_runtime`` (wall seconds) has passed."""
        return self._wall_deadline is not None and time.monotonic() >= self._wall_deadline

    # -- receiving -------------------------------------------------------------------------

    def poll(self, timeout: float) -> None:
        """Handle at most one message from the server."""
        got = self.link.recv(timeout)
        if got is None:
            return
        src, data = got
        bc = unpack_broadcast_body(data) if src == SERVER_ID else None
        if (
            bc is not None
        ):  # a model body on the broadcast downlink (used once an envelope names it)
            self._bodies.put(*bc)
            waiting = self._waiting_body.pop(bc[0], None)
            if waiting is not None:
                self._on_model(*waiting)
            return
        try:
            # A SERVER_HELLO announces a new session: authenticated, any session accepted.
            hello = peek(data).type is MsgType.SERVER_HELLO
            env = open_envelope(
                data,
                src,
                self.keys,
                self.robot_id,
                None if hello else self.session,
                self.guard,
                peer_of=self.robot_id,
            )
        except ProtocolError as exc:
            log.warning("robot %d: dropped a message from node %s: %s", self.robot_id, src, exc)
            return
        self._last_heard = self.clock()
        if env.type is MsgType.REGISTER_ACK:
            if env.meta.get("nonce") != self._pending_nonce or self._pending_nonce is None:
                log.warning("robot %d: REGISTER_ACK with a stale nonce", self.robot_id)
                return
            if self.server_public_key is not None and not verify(
                self.server_public_key,
                env.meta.get("sig"),
                "register_ack",
                session=env.session,
                robot=self.robot_id,
                nonce=self._pending_nonce,
            ):
                log.warning("robot %d: REGISTER_ACK not signed by the server", self.robot_id)
                return
            if not env.meta.get("accepted", False):
                log.error(
                    "robot %d: registration refused: %s", self.robot_id, env.meta.get("reason")
                )
                self.refused = str(env.meta.get("reason", ""))
                self.done = True
                return
            theirs = env.meta.get("mcs_table")
            if theirs != MCS_TABLE_VERSION:  # this end checks too (a server without the check)
                self.refused = (
                    f"MCS table version mismatch: the server has "
                    f"{'none (older software)' if theirs is None else theirs}, this robot "
                    f"has {MCS_TABLE_VERSION}; update one of them"
                )
                log.error("robot %d: registration refused: %s", self.robot_id, self.refused)
                self.done = True
                return
            if env.session != self.session:  # a new session: the server knows nothing of us
                self._uploads.clear()  # a model sent again is trained
            self.session = env.session
            self._pending_nonce = None
            self.registrations += 1
            # the model the server knows we hold (its next model is a delta against it): a
            # robot that does not hold it (a restarted process) asks for a full one
            holds = env.meta.get("holds")
            if holds != self.state_sha:
                self.state, self.state_sha = None, None
                if holds is not None:
                    log.info("robot %d: the server thinks we hold a model; resync", self.robot_id)
                    self.ep.send(MsgType.RESYNC, SERVER_ID, self.key, self.session, 0, {})
            log.info("robot %d registered, session %08x", self.robot_id, env.session)
            early, self._early_model = self._early_model, None
            if early is not None and early.session == self.session:
                self._on_model(early.round, early.meta, early.body)
            return
        if env.type is MsgType.SERVER_HELLO:
            if env.session == self.session:
                return
            if self._pending_nonce is not None:  # registering: answer a new challenge now
                if env.session != self._challenge:
                    self._challenge = env.session
                    self._send_register(4.0)
                return
            self._challenge = env.session
            log.info(
                "robot %d: server session %08x announced; registering",
                self.robot_id,
                env.session,
            )
            self.session = None
            self.register(timeout=30.0)
            return
        if self.session is None or env.session != self.session:
            if (
                env.type is MsgType.MODEL
                and self.session is None
                and self._pending_nonce is not None
                and env.session == self._challenge
            ):
                # the round's model overtook our REGISTER_ACK (the ARQ does not order
                # messages): keep it for when the ACK comes, rather than miss the round
                self._early_model = env
                log.info("robot %d: MODEL before REGISTER_ACK; kept", self.robot_id)
                return
            log.warning("robot %d: %s outside a session", self.robot_id, env.type.name)
            return
        if env.type is MsgType.MODEL:
            self._on_model(env.round, env.meta, env.body)
        elif env.type is MsgType.UNLEARN_ACK:
            if self.server_public_key is not None and not verify(
                self.server_public_key,
                env.meta.get("sig"),
                "unlearn_ack",
                session=self.session,
                robot=self.robot_id,
                accepted=env.meta.get("accepted"),
            ):
                log.warning("robot %d: UNLEARN_ACK not signed by the server", self.robot_id)
                return
            self.unlearn_ack = dict(env.meta)
            log.info(
                "robot %d: unlearning request %s (%s)",
                self.robot_id,
                "accepted" if env.meta.get("accepted") else "refused",
                env.meta.get("reason"),
            )
        elif env.type is MsgType.REJECT:
            self.rejects.append({"round": env.round, **env.meta})
            log.info(
                "robot %d: server rejected r%d: %s",
                self.robot_id,
                env.round,
                env.meta.get("reason"),
            )
        elif env.type is MsgType.RECEIPT:
            self._on_receipt(env.meta, env.body)
        elif env.type is MsgType.BYE:
            log.info("robot %d: server says the run is over", self.robot_id)
            self.done = True

    def _on_receipt(self, meta: Mapping[str, Any], body: bytes) -> None:
        """The erasure receipt of this robot's request: checked (the server's signature, the
        models it names against those this robot was sent and evaluated, its history version
        against the highest held), then kept; a receipt that fails is refused and counted."""
        source = f"robot {self.robot_id}: erasure receipt"
        held = (self.evals.get("unlearned") or {}).get("sha256")
        before = (self.evals.get("before") or {}).get("sha256")
        try:
            if meta.get("receipt_version") != RECEIPT_VERSION:
                raise ReceiptError(
                    f"{source}: version {meta.get('receipt_version')!r} is not supported"
                )
            receipt = parse_receipt(body, source)
            if self.server_public_key is None:
                log.warning("%s: no server public key, its signature is not checked", source)
            else:
                verify_receipt(receipt, self.server_public_key, None, source)
            if held is not None and receipt["model_after"]["sha256"] != held:
                raise ReceiptError(
                    f"{source}: it is not about the model this robot was sent: it names "
                    f"{receipt['model_after']['sha256'][:16]}..., the robot holds {held[:16]}..."
                )
            if before is not None and receipt["model_before"]["sha256"] != before:
                raise ReceiptError(
                    f"{source}: the model it says was replaced is not the one this robot "
                    "evaluated before the request"
                )
            matched = self._check_own_updates(receipt, source)
            store = str(receipt["history"]["store_id"])
            version = int(receipt["history"]["version"])
            top = self.heads.get(store)
            if top is not None and version <= top:
                raise ReceiptError(
                    f"{source}: history version {version} is not above version {top} of a "
                    "receipt held: the server's history went back"
                )
        except (ReceiptError, KeyError, TypeError, ValueError) as exc:
            log.error("%s", exc)
            self.rejects.append({"round": 0, "reason": "bad_receipt", "detail": str(exc)})
            return
        self.heads[store] = version
        self.receipts.append(receipt)
        self.receipt_checks.append(
            {
                "signature": self.server_public_key is not None,
                "model_after": held is not None,
                "model_before": before is not None,
                "own_updates_matched": matched,
            }
        )
        if self.receipts_dir is not None:
            self.receipts_dir.mkdir(parents=True, exist_ok=True)
            name = f"receipt-{len(self.receipts)}-v{version}.json"
            (self.receipts_dir / name).write_text(receipt_text(receipt))
        log.info(
            "robot %d: erasure receipt for %s checked: model %s... replaced %s..., %d stored "
            "updates erased at history version %d",
            self.robot_id,
            receipt["request"]["text"],
            receipt["model_after"]["sha256"][:12],
            receipt["model_before"]["sha256"][:12],
            len((receipt.get("erasure") or {}).get("updates") or []),
            version,
        )

    def _on_model(self, t: int, meta: Mapping[str, Any], body: bytes) -> None:
        want = meta.get("body_sha256")
        if body:  # a unicast model (the server's fall-back included) supersedes one waiting
            self._waiting_body.clear()
        if not body and isinstance(want, str):  # the body comes (came) by broadcast
            got = self._bodies.get(want)
            if got is None:
                self._waiting_body = {want: (t, meta, b"")}  # only the latest model waits
                return
            body = got
        base = meta.get("base_sha256")
        ref = None
        if base is not None:
            if self.state is None or base != self.state_sha:
                log.warning("robot %d: delta against a model we do not hold; resync", self.robot_id)
                self.ep.send(MsgType.RESYNC, SERVER_ID, self.key, self.session or 0, t, {})
                return
            ref = self.state
        try:
            state = decode_state(body, reference=ref)
        except Exception as exc:
            log.warning("robot %d: undecodable model: %s", self.robot_id, exc)
            self.ep.send(MsgType.RESYNC, SERVER_ID, self.key, self.session or 0, t, {})
            return
        if ref is not None:
            state = cast_like(state, ref)
        sha = state_sha256(state)
        if sha != meta.get("sha256"):
            log.warning("robot %d: model hash mismatch; resync", self.robot_id)
            self.ep.send(MsgType.RESYNC, SERVER_ID, self.key, self.session or 0, t, {})
            return
        purpose = str(meta.get("purpose"))
        if self.server_public_key is not None and not verify(
            self.server_public_key,
            meta.get("sig"),
            "model",
            session=self.session,
            robot=self.robot_id,
            round=t,
            purpose=purpose,
            sha256=sha,
        ):
            log.warning(
                "robot %d: %s model r%d not signed by the server", self.robot_id, purpose, t
            )
            self.rejects.append({"round": t, "reason": "bad_signature", "purpose": purpose})
            return
        send_id = meta.get("send_id")
        if purpose == "train" and self._upload_live(t, sha, send_id):
            log.info(
                "robot %d: round %d model of send %s again, upload %s: not training it twice",
                self.robot_id,
                t,
                send_id,
                self._uploads[t][2].status.value,
            )
            return
        self.state, self.state_sha = state, sha
        self.model.load_state_dict(tensors(state))  # copied into the model
        if purpose == "train":
            if self._requested and (self.unlearn or {}).get("kind") == "client":
                log.info("robot %d: asked to be forgotten; not training round %d", self.robot_id, t)
                return
            self._train_and_upload(t, meta)
        else:
            self._evaluate_and_report(purpose, meta)

    def _upload_live(self, t: int, sha: str, send_id: Any) -> bool:
        """Whether round t was trained from this very send (model ``sha``, the server's
        ``send_id``) and its upload is under way or delivered. A failed upload, a send without
        an id, or another send of the same model (the server retrying the round) is trained."""
        got = self._uploads.get(t)
        if got is None or send_id is None or got[:2] != (sha, send_id):
            return False
        return got[2].status.value in ("pending", "delivered")

    # -- work ------------------------------------------------------------------------------

    def _train_and_upload(self, t: int, meta: Mapping[str, Any]) -> None:
        """Train round t from the model just loaded and upload the update."""
        assert self.state is not None and self.session is not None
        self.faults.before_training(self, t)
        t0 = time.perf_counter()
        c0 = self.clock()  # the round's time left counts on the server's (the link's) clock
        local = train_client(
            self.model,
            tensors(self.state),
            np.arange(len(self.data)),
            self.data.train,
            self.local,
            self.seed,
            t,
            client_of(self.robot_id),
        )
        train_s = time.perf_counter() - t0
        update_sha = self._update_sha256(local)
        upload = self.faults.replace_upload(t, arrays(local), self.state)
        stats = link_stats(self.link).get("arq", {})
        up_meta = {
            "num_samples": len(self.data),
            "train_s": train_s,
            "model_sha256": self.state_sha,
            "link_bytes_tx": int(stats.get("bytes_tx", self.ep.sent_bytes)),
        }
        body = encode_state(upload, str(self.tb.upload_encoding))
        # No point uploading past the round deadline (the server would refuse it as late);
        # deadline_s is on the server's clock, the link's (virtual s on ofdm-shared)
        left = float(meta.get("deadline_s") or 0.0) - (self.clock() - c0)
        timeout = float(self.tb.send_timeout_s)
        if left > 0:
            timeout = min(timeout, left + 2.0)
        self.faults.before_upload(self, t, upload, up_meta, timeout)
        sealed = self.ep.build(MsgType.UPDATE, SERVER_ID, self.key, self.session, t, up_meta, body)
        res = self.ep.send_raw(SERVER_ID, sealed, timeout)
        self._uploads = {t: (self.state_sha or "", meta.get("send_id"), res)}  # this round's
        wait_on_clock(res, timeout + 5, self.clock)  # the ARQ's verdict, on its own clock
        self.rounds.append(
            {
                "round": t,
                "model_sha256": self.state_sha,  # of the tensors it trained from (bit-exact)
                "train_s": train_s,
                "upload": res.status.value,
                "upload_bytes": len(sealed),
                "update_sha256": update_sha,  # as the server stores it (receipts name it)
            }
        )
        log.info(
            "robot %d: round %d trained in %.1fs, upload %s (%d B)",
            self.robot_id,
            t,
            train_s,
            res.status.value,
            len(sealed),
        )
        self.faults.after_upload(self, t, up_meta, body, sealed, timeout)
        if (
            self.unlearn is not None
            and not self._requested
            and self.unlearn_after_round is not None
            and t >= self.unlearn_after_round
        ):
            self.request_unlearning()

    def _check_own_updates(self, receipt: Mapping[str, Any], source: str) -> int:
        """How many erased updates a receipt names are this robot's own uploads (by digest);
        ReceiptError when it names one of this robot's rounds with another digest."""
        mine = client_of(self.robot_id)
        known: dict[int, set[str]] = {}
        for row in self.rounds:
            if row.get("update_sha256"):
                known.setdefault(int(row["round"]), set()).add(str(row["update_sha256"]))
        matched = 0
        for u in (receipt.get("erasure") or {}).get("updates") or []:
            t, sha = int(u["round"]), u.get("sha256")
            if int(u["client"]) != mine or not sha or t not in known:
                continue
            if sha not in known[t]:
                raise ReceiptError(
                    f"{source}: the erased update of round {t} it names is not the one this "
                    "robot uploaded"
                )
            matched += 1
        return matched

    def _update_sha256(self, local: Mapping[str, torch.Tensor]) -> str | None:
        """The digest of this round's update as the server's history stores it (local minus
        the global model, in the history's precision); None when the upload is not bit-exact
        (fp16/int8 encodings), so the server's copy cannot be predicted."""
        if str(self.tb.upload_encoding) != "raw" or self.state is None:
            return None
        ref = tensors(self.state)
        dtype = torch.float16 if bool(self.cfg.history.fp16) else torch.float32
        upd = {
            k: (v.detach().float() - ref[k].float()).to(dtype)
            for k, v in local.items()
            if torch.is_floating_point(v)
        }
        return state_sha256(upd)

    def request_unlearning(self) -> None:
        """Ask the server to forget this robot's data (client), class or samples."""
        assert self.unlearn is not None
        meta = {"robot": self.robot_id, **self.unlearn}
        self.ep.send(MsgType.UNLEARN_REQUEST, SERVER_ID, self.key, self.session or 0, 0, meta)
        self._requested = True
        log.info("robot %d: unlearning request sent: %s", self.robot_id, meta)

    def _evaluate_and_report(self, purpose: str, meta: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        m = robot_metrics(self.model, self.data, meta.get("request"), self.robot_id)
        stats = link_stats(self.link).get("arq", {})
        # the bit-exact claim: a digest of the tensors the evaluated model actually holds
        loaded_sha = state_sha256(arrays(self.model.state_dict()))
        rep = {
            "purpose": purpose,
            "sha256": loaded_sha,
            "metrics": m,
            "eval_s": time.perf_counter() - t0,
            "link_bytes_tx": int(stats.get("bytes_tx", self.ep.sent_bytes)),
        }
        self.evals[purpose] = rep
        self.ep.send(MsgType.EVAL_REPORT, SERVER_ID, self.key, self.session or 0, 0, rep)
        log.info("robot %d: %s model: %s", self.robot_id, purpose, fmt(m))

    # -- main loop -------------------------------------------------------------------------

    def run(self, max_runtime: float | None = None) -> dict[str, Any]:
        """Register, then serve the server until BYE (or ``max_runtime`` seconds)."""
        start = time.monotonic()
        self._wall_deadline = None if max_runtime is None else start + float(max_runtime)
        while not self.done and not self.register(timeout=60.0):
            if self.out_of_time():
                log.warning(
                    "robot %d: max runtime reached before the edge server answered",
                    self.robot_id,
                )
                return self.summary(time.monotonic() - start)
        # robot_idle_s on the link's clock: on ofdm-shared the medium's virtual time, which
        # runs at about a tenth of real time while the medium is busy (on the wall clock robots
        # that had uploaded gave up on a server still repairing another robot's transfer).
        # max_runtime stays on the wall: it is the operator's bound on the process.
        idle = float(self.tb.robot_idle_s)
        while not self.done:
            if self.out_of_time():
                log.warning("robot %d: max runtime reached", self.robot_id)
                break
            self.poll(0.5)
            if self.clock() - self._last_heard > idle:
                log.info(
                    "robot %d: server silent for %.0fs; registering again", self.robot_id, idle
                )
                self.reregistrations += 1
                # keep the current session until a REGISTER_ACK brings a new one: a server that
                # was only busy (a long unlearning run) still reaches us meanwhile
                self.register(timeout=60.0)
                self._last_heard = self.clock()
        return self.summary(time.monotonic() - start)

    def summary(self, runtime_s: float) -> dict[str, Any]:
        """What the robot did (rounds, evaluations with model hashes, rejections)."""
        return {
            "robot": self.robot_id,
            "runtime_s": runtime_s,
            "load_s": self.load_s,
            "registrations": self.registrations,
            "refused": self.refused,
            "idle_reregistrations": self.reregistrations,
            "rounds": self.rounds,
            "evals": self.evals,
            "rejects": self.rejects,
            "unlearn_ack": self.unlearn_ack,
            "receipts": self.receipts,
            "receipt_checks": self.receipt_checks,
            "link": link_stats(self.link),
            "sent_bytes": self.ep.sent_bytes,
        }
