"""SCALE for a stock Flower app: a Message-API strategy that records and unlearns.

:class:`UnlearningStrategy` wraps any aggregation strategy of Flower's Message API
(``flwr.serverapp.strategy``: ``FedAvg``, ``FedAdam``, ``FedProx``, ``FedMedian``, ... or your
own ``Strategy``) and leaves the aggregation to it. Around it, it

1. **registers** every SuperNode (a ``query.scaleflu`` message, answered by
   :func:`scaleflu.flower.client.add_registration`): which client of the federation's partition
   the node is and how many samples it holds (checked against the partition the scaleflu
   config describes);
2. **selects** the clients of round t with the runtime's seeded selection
   (:class:`scaleflu.fl.strategy.FedAvg`; ``selection="seeded"``, the default with a config),
   so a Flower run, its Retrain and ``scaleflu train`` pick the same clients; or keeps the
   wrapped strategy's own sampling (``selection="inner"``);
3. **records** every accepted client's local model of every round, the data sizes M_n and the
   aggregate the wrapped strategy made into the runtime's history store
   (:class:`scaleflu.fl.history.HistoryStore`: SQLite + safetensors, authenticated digests
   under ``integrity_key``, the per-group change log the AoI of SCALE is computed from), with
   the server's evaluation of every global model, in a run directory that ``scaleflu unlearn``
   and ``scaleflu.unlearn.run.run_unlearning`` read like one ``scaleflu train`` wrote;
4. **collects** the unlearning requests clients attach to their replies
   (:func:`scaleflu.flower.client.request_forget`) -- in every round, and after the last one
   from every registered node (:meth:`UnlearningStrategy.collect`) -- each bound to the client
   its node registered as, and answers them in that node's next message; and
5. **serves** them after the last round (or when :meth:`serve` is called) with SCALE or any
   registered method, side by side with the ``compare`` methods (Retrain, the fine-tune
   control), writes every method's model and result with the audit columns of Table II, and
   deploys the chosen method's model: the history's erasure of the requester's updates, the
   run's final model, and the ``Result`` the strategy's ``start`` returns; each requester is
   told ``served: <method>`` (:meth:`UnlearningStrategy.notify`).

Every reply is checked before the wrapped strategy sees it (:mod:`scaleflu.flower.wire`): a
node that sends a malformed record, another client's id, a model of other shapes or with
non-finite values, or a data size that is not its partition's is left out of that round with
one log line; the round goes on with the others.

What serving needs from the app: a scaleflu config describing the federation (data set,
partition, poisoning, model; ``config``) from which the runtime rebuilds the forget set, the
remaining clients' data and the server's validation set, as in ``scaleflu train``; the clients
holding exactly those partitions (:func:`scaleflu.flower.task`-style helpers in the example);
and the initial model of the config's seed (:meth:`UnlearningStrategy.initial_arrays`), the
model Retrain starts from. Without a config (``model=`` only) the strategy records the history
but cannot serve (docs/flower.md).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from scaleflu.config import Config, ConfigError, save_config
from scaleflu.experiments.report import METHOD_LABELS, cell_values
from scaleflu.fl.history import HistoryStore, LinkModel
from scaleflu.fl.integrity import load_model, save_model, trust
from scaleflu.fl.models import layer_groups
from scaleflu.fl.run import (
    FLSetup,
    append_jsonl,
    build_setup,
    load_run,
    open_history,
    write_training_outputs,
)
from scaleflu.fl.strategy import NOT_EVALUATED, FedAvg
from scaleflu.flower.wire import (
    ACKS_KEY,
    PHASE_COLLECT,
    PHASE_KEY,
    PHASE_NOTIFY,
    PHASE_REGISTER,
    QUEUED,
    REGISTER_TYPE,
    Identity,
    WireError,
    acks_record,
    arrays_from_state,
    read_identity,
    state_from_arrays,
)
from scaleflu.log import fmt
from scaleflu.unlearn.baselines.aoi_trace import annotate, replay_scale_trace
from scaleflu.unlearn.outputs import write_unlearning
from scaleflu.unlearn.registry import canonical_name
from scaleflu.unlearn.request import UnlearnRequest, parse_request
from scaleflu.unlearn.run import run_unlearning

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]

__all__ = ["QueuedRequest", "ServedRequest", "UnlearningStrategy"]


@dataclass(frozen=True)
class QueuedRequest:
    """A client's accepted request: who asked (client, node), its id, the bound request."""

    client: int
    node: int
    request_id: int
    request: UnlearnRequest
    round: int


@dataclass
class ServedRequest:
    """One request served: every method's result (the ``UnlearnResult`` schema), the audit
    rows of Table II, where the outputs are, and which method's model was deployed."""

    request: QueuedRequest | None
    text: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    audit: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None
    deployed: str | None = None
    erasure: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict)  # method -> why it failed

    def to_json(self) -> dict[str, Any]:
        """The side-by-side record written to ``side_by_side.json``."""
        return {
            "request": self.text,
            "client": None if self.request is None else self.request.client,
            "round_received": None if self.request is None else self.request.round,
            "deployed": self.deployed,
            "errors": self.errors,
            "audit": self.audit,
            "erasure": self.erasure,
            "results": {m: str(self.out_dir / _slug_dir(self.text, m)) for m in self.results}
            if self.out_dir
            else {},
        }


def _slug_dir(text: str, method: str) -> str:
    return f"{parse_request(text).slug}-{method}"


class UnlearningStrategy(Strategy):
    """Wrap ``inner`` (any Message-API strategy); record into ``run_dir``; serve requests.

    ``config``: the scaleflu config describing the federation (a mapping or a
    :class:`~scaleflu.config.Config`; ``fl.rounds`` is set from ``num_rounds``). ``model``:
    without a config, a module of the app's architecture (recording only). ``method``: the
    method that serves requests and whose model is deployed (``scale``); ``compare``: methods
    run beside it on the same request (``retrain``, ``finetune``: the fine-tune control).
    ``selection``: ``seeded`` (the runtime's seeded C[t]) or ``inner`` (the wrapped strategy's
    sampling). ``evaluate``: the server's evaluation of every global model on the config's test
    set (recorded per round). ``serve_at_end``: serve the requests when ``start`` ends;
    ``deploy``: make the served model the run's final model (and erase the requester's stored
    updates). ``unlearn_overrides``: ``scale.*`` / ``baselines.*`` settings of the methods.
    ``integrity_key``: authenticated digests of the history and models (>= 16 bytes).
    ``expected_nodes``: how many SuperNodes registration waits for (default: the config's
    ``data.num_clients``, else the nodes connected), at most ``register_timeout`` seconds.
    """

    def __init__(
        self,
        inner: Strategy,
        run_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        *,
        model: nn.Module | None = None,
        method: str = "scale",
        compare: Sequence[str] = ("retrain", "finetune"),
        selection: str | None = None,
        evaluate: bool = True,
        serve_at_end: bool = True,
        deploy: bool = True,
        unlearn_overrides: Sequence[str] = (),
        integrity_key: bytes | None = None,
        expected_nodes: int | None = None,
        register_timeout: float = 120.0,
        progress: bool = False,
    ) -> None:
        if config is None and model is None:
            raise ConfigError(
                "UnlearningStrategy needs a scaleflu config (or, to record only, a model)"
            )
        if selection is None:
            selection = "seeded" if config is not None else "inner"
        if selection not in ("seeded", "inner"):
            raise ConfigError(f"selection must be seeded or inner, got {selection!r}")
        if selection == "seeded" and config is None:
            raise ConfigError("selection='seeded' needs a scaleflu config (the seed and C[t] size)")
        self.inner = inner
        self.run_dir = Path(run_dir)
        self.config = None if config is None else copy.deepcopy(dict(config))
        self.model = model
        self.method = canonical_name(method)
        self.compare = tuple(canonical_name(m) for m in compare if canonical_name(m) != self.method)
        self.selection = selection
        self.evaluate_rounds = bool(evaluate)
        self.serve_at_end = bool(serve_at_end)
        self.deploy = bool(deploy)
        self.unlearn_overrides = tuple(unlearn_overrides)
        self.integrity_key = integrity_key
        self.expected_nodes = expected_nodes
        self.register_timeout = float(register_timeout)
        self.progress = progress
        self.arrays_key = str(getattr(inner, "arrayrecord_key", "arrays"))
        self.weight_key = str(getattr(inner, "weighted_by_key", "num-examples"))
        # filled by start()
        self.cfg: Config | None = None
        self.setup: FLSetup | None = None
        self.history: HistoryStore | None = None
        self.num_rounds = 0
        self.rounds: FedAvg | None = None  # the runtime's round: seeded C[t]
        self.evaluator: Callable[[Mapping[str, torch.Tensor]], dict[str, Any]] | None = None
        self.reference: State = {}
        self.node_client: dict[int, int] = {}
        self.client_node: dict[int, int] = {}
        self.sizes: dict[int, int] = {}  # M_n the config's partition gives (empty: unknown)
        self.requests: list[QueuedRequest] = []
        self.served: list[ServedRequest] = []
        self.metrics: list[dict[str, Any]] = []
        self.refused: dict[int, dict[int, str]] = {}  # round -> {node: why}
        self._answers: dict[int, dict[int, str]] = {}  # client -> {request id: status} to send
        self._seen: set[tuple[int, int]] = set()  # (client, request id) answered
        self._asked: dict[int, set[str]] = {}  # client -> the requests it made (bound text)
        self._theta: State = {}
        self._t0 = 0.0

    # -- set-up ----------------------------------------------------------------------------

    def initial_arrays(self) -> ArrayRecord:
        """The initial model Theta[1] of the config's seed (what the app must start from)."""
        return arrays_from_state(self._prepare_setup().model.state_dict())

    def _prepare_setup(self) -> FLSetup:
        if self.setup is None:
            if self.config is None:
                raise ConfigError("no scaleflu config: the strategy records but cannot serve")
            self.setup = build_setup(self.config)
        return self.setup

    def _open(self, initial_arrays: ArrayRecord, num_rounds: int) -> None:
        """Write the run's config, open its history, check and record Theta[1]."""
        if (self.run_dir / "history").is_dir() and (self.run_dir / "config.yaml").is_file():
            raise ConfigError(
                f"{self.run_dir} already holds a run; give the strategy a new run directory"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.integrity_key is not None:
            trust(self.run_dir, self.integrity_key)
        self.num_rounds = int(num_rounds)
        if self.config is not None:
            cfg = copy.deepcopy(self.config)
            cfg.setdefault("fl", {})
            cfg["fl"] = {**dict(cfg["fl"]), "rounds": self.num_rounds}
            self.config = cfg
            self.setup = None
            setup = self._prepare_setup()
            self.cfg = setup.cfg
            save_config(self.cfg, self.run_dir / "config.yaml")
            model = setup.model
            self.sizes = dict(setup.data_sizes)
            self.history = open_history(self.cfg, self.run_dir, model)
            self.rounds = FedAvg.from_config(self.cfg, self.sizes)
            if self.evaluate_rounds:
                eval_model = setup.new_model()
                self.evaluator = setup.evaluator(eval_model, self.cfg.fl.eval_batch_size)
        else:
            assert self.model is not None
            model = self.model
            self.history = HistoryStore(
                self.run_dir, groups=layer_groups(model, 8), link=LinkModel()
            )
        self.reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
        initial = state_from_arrays(initial_arrays, self.reference, "initial_arrays")
        if self.config is not None:
            diff = max(
                (
                    float((initial[k].double() - v.double()).abs().max())
                    for k, v in self.reference.items()
                    if v.is_floating_point() and v.numel()
                ),
                default=0.0,
            )
            if diff != 0.0:
                raise ConfigError(
                    "initial_arrays is not the config's initial model (max |difference| "
                    f"{diff:.3g}); start from strategy.initial_arrays(): Retrain starts there"
                )
        self.history.record_initial(initial)
        (self.run_dir / "metrics.jsonl").write_text("")

    # -- registration ----------------------------------------------------------------------

    def register(self, grid: Grid, node_ids: Iterable[int] | None = None) -> dict[int, int]:
        """Ask ``node_ids`` (default: every connected node not registered yet) who they are.

        Waits (at most ``register_timeout`` s) until ``expected_nodes`` are connected when
        asking everyone. Returns node -> client of the nodes registered now.
        """
        if node_ids is None:
            want = self.expected_nodes or (len(self.sizes) if self.sizes else 0)
            deadline = time.monotonic() + self.register_timeout
            while True:
                nodes = list(grid.get_node_ids())
                if len(nodes) >= want or time.monotonic() >= deadline:
                    break
                time.sleep(1.0)
            if len(nodes) < want:
                log.warning("registration: %d of %d nodes connected", len(nodes), want)
            node_ids = nodes
        todo = [n for n in node_ids if n not in self.node_client]
        got = self._query(grid, todo, PHASE_REGISTER)
        if todo:
            missing = len(todo) - len(got)
            log.info(
                "registered %d node(s)%s",
                len(got),
                f" ({missing} did not answer)" if missing else "",
            )
        return got

    def _query(self, grid: Grid, nodes: Sequence[int], phase: str, t: int = 0) -> dict[int, int]:
        """Send ``query.scaleflu`` (``phase``: register, collect, notify) to ``nodes`` with the
        answers owed to each; take the identities and requests of the replies."""
        if not nodes:
            return {}
        msgs = []
        for node in nodes:
            content = RecordDict({PHASE_KEY: ConfigRecord({"phase": phase, "server-round": t})})
            self._attach_acks(node, content)
            msgs.append(Message(content, dst_node_id=node, message_type=REGISTER_TYPE))
        replies = grid.send_and_receive(msgs, timeout=self.register_timeout)
        got = {}
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                log.warning("%s: node %d answered with an error: %s", phase, node, msg.error.reason)
                continue
            try:
                ident = self._identify(msg, phase, t)
            except WireError as exc:
                log.warning("%s", exc)
                continue
            got[node] = ident.client_id
        return got

    def collect(self, grid: Grid) -> int:
        """After the last round: ask every registered node for the requests it holds (a client
        that was not selected late in the run still gets heard). Returns how many arrived."""
        before = len(self.requests)
        self._query(grid, list(self.node_client), PHASE_COLLECT, self.num_rounds + 1)
        return len(self.requests) - before

    def notify(self, grid: Grid) -> None:
        """Tell the nodes what became of their requests (``served: <method>``, ``refused``)."""
        nodes = [self.client_node[n] for n in self._answers if n in self.client_node]
        self._query(grid, nodes, PHASE_NOTIFY, self.num_rounds + 1)

    def _identify(self, msg: Message, what: str, t: int = 0) -> Identity:
        """Check a reply's identity, bind its node to its client, take its requests."""
        node = int(msg.metadata.src_node_id)
        where = f"node {node} ({what})"
        n_clients = len(self.sizes) or None
        ident = read_identity(msg.content, where, n_clients)
        n = ident.client_id
        bound = self.node_client.get(node)
        if bound is not None and bound != n:
            raise WireError(f"{where}: registered as client {bound}, now claims client {n}")
        other = self.client_node.get(n)
        if bound is None and other is not None and other != node:
            raise WireError(f"{where}: claims client {n}, registered by node {other}")
        if ident.num_examples is not None and self.sizes and ident.num_examples != self.sizes[n]:
            raise WireError(
                f"{where}: client {n} reports {ident.num_examples} samples, its partition in "
                f"the config holds {self.sizes[n]} (the client's data is not the config's)"
            )
        if bound is None:
            self.node_client[node] = n
            self.client_node[n] = node
        self._take_requests(node, ident, t)
        return ident

    def _take_requests(self, node: int, ident: Identity, t: int) -> None:
        n = ident.client_id
        for rid, why in ident.bad_requests:
            if (n, rid) not in self._seen:
                self._seen.add((n, rid))
                self._answers.setdefault(n, {})[rid] = f"refused: {why}"
                log.warning("client %d: request %d refused: %s", n, rid, why)
        for req in ident.requests:
            if (n, req.request_id) in self._seen:
                continue
            self._seen.add((n, req.request_id))
            try:
                bound = req.bind(n)
            except ValueError as exc:
                self._answers.setdefault(n, {})[req.request_id] = f"refused: {exc}"
                continue
            if bound.text in self._asked.get(n, set()):  # the same request, asked again
                self._answers.setdefault(n, {})[req.request_id] = "refused: asked already"
                continue
            self._asked.setdefault(n, set()).add(bound.text)
            self.requests.append(QueuedRequest(n, node, req.request_id, bound, t))
            self._answers.setdefault(n, {})[req.request_id] = QUEUED
            log.info("client %d (node %d) asks to forget: %s (round %d)", n, node, bound.text, t)

    def _attach_acks(self, node: int, content: RecordDict) -> None:
        n = self.node_client.get(node)
        if n is not None and self._answers.get(n):
            content[ACKS_KEY] = acks_record(self._answers.pop(n))

    # -- the Strategy interface ------------------------------------------------------------

    def summary(self) -> None:
        """Log the wrapped strategy's summary and what this wrapper adds."""
        self.inner.summary()
        log.info(
            "UnlearningStrategy: history in %s, selection %s, serves with %s (beside %s)",
            self.run_dir,
            self.selection,
            self.method,
            ", ".join(self.compare) or "nothing",
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's messages, to the seeded C[t] (with ``selection="seeded"``),
        each with the answers owed to its node; Theta[t] is kept for the record."""
        self._t0 = time.perf_counter()
        self._theta = state_from_arrays(arrays, self.reference, f"round {server_round} model")
        unknown = [n for n in grid.get_node_ids() if n not in self.node_client]
        if unknown:
            self.register(grid, unknown)
        msgs = list(self.inner.configure_train(server_round, arrays, config, grid))
        if not msgs:
            return []
        if self.selection == "seeded":
            assert self.rounds is not None
            chosen = self.rounds.configure_train(server_round, available=list(self.client_node))
            nodes = [self.client_node[n] for n in chosen]
            absent = [n for n in self.rounds.configure_train(server_round) if n not in chosen]
            if absent:
                log.warning("round %d: selected client(s) %s have no node", server_round, absent)
            template = msgs[0]
            msgs = [
                Message(
                    RecordDict(dict(template.content.items())),
                    dst_node_id=node,
                    message_type=template.metadata.message_type,
                )
                for node in nodes
            ]
        else:  # each message its own RecordDict, so the answers go to their node only
            msgs = [
                Message(
                    RecordDict(dict(m.content.items())),
                    dst_node_id=m.metadata.dst_node_id,
                    message_type=m.metadata.message_type,
                )
                for m in msgs
            ]
        for m in msgs:
            self._attach_acks(m.metadata.dst_node_id, m.content)
        return msgs

    def _check_train_reply(self, msg: Message, t: int) -> tuple[int, int, State]:
        """(client, M_n, local model) of a train reply, or WireError."""
        node = int(msg.metadata.src_node_id)
        where = f"node {node} (round {t})"
        ident = self._identify(msg, f"round {t}", t)
        content = msg.content
        if len(content.array_records) != 1 or self.arrays_key not in content.array_records:
            raise WireError(f"{where}: expected one ArrayRecord {self.arrays_key!r}")
        if len(content.metric_records) != 1:
            raise WireError(f"{where}: expected one MetricRecord")
        metrics = next(iter(content.metric_records.values()))
        size = metrics.get(self.weight_key)
        if isinstance(size, bool) or not isinstance(size, int | float) or not size > 0:
            raise WireError(f"{where}: {self.weight_key!r} must be a positive number, got {size!r}")
        if not math.isfinite(float(size)) or float(size) != int(size):
            raise WireError(f"{where}: {self.weight_key!r} must be a whole number, got {size!r}")
        n = ident.client_id
        if self.sizes and int(size) != self.sizes[n]:
            raise WireError(
                f"{where}: client {n} trained on {int(size)} samples, its partition holds "
                f"{self.sizes[n]}"
            )
        state = state_from_arrays(content[self.arrays_key], self.reference, where)
        return n, int(size), state

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies, let the wrapped strategy aggregate the good ones (in ascending
        client order), record the round in the history store."""
        t = int(server_round)
        good: list[tuple[int, Message]] = []
        sizes: dict[int, int] = {}
        states: dict[int, State] = {}
        errors: list[Message] = []
        refused: dict[int, str] = {}
        for msg in replies:
            if msg.has_error():
                errors.append(msg)
                continue
            try:
                n, m_n, state = self._check_train_reply(msg, t)
                if n in states:
                    raise WireError(
                        f"node {msg.metadata.src_node_id}: a second reply for client {n}"
                    )
            except WireError as exc:
                refused[int(msg.metadata.src_node_id)] = str(exc)
                log.warning("%s; reply left out", exc)
                continue
            good.append((n, msg))
            sizes[n], states[n] = m_n, state
        # replies whose MetricRecord keys differ from the others' would make Flower's own
        # consistency check refuse the whole round: they are left out instead
        good.sort(key=lambda item: item[0])
        if good:
            first = set(next(iter(good[0][1].content.metric_records.values())).keys())
            for n, msg in list(good):
                if set(next(iter(msg.content.metric_records.values())).keys()) != first:
                    why = f"node {msg.metadata.src_node_id}: its MetricRecord keys differ"
                    refused[int(msg.metadata.src_node_id)] = why
                    log.warning("%s; reply left out", why)
                    good.remove((n, msg))
                    del sizes[n], states[n]
        if refused:
            self.refused[t] = refused
        arrays, metrics = self.inner.aggregate_train(server_round, [m for _, m in good] + errors)
        clients = [n for n, _ in good]
        if arrays is None:
            log.warning("round %d: the wrapped strategy aggregated nothing; model unchanged", t)
            new_state = {k: v.clone() for k, v in self._theta.items()}
            clients, sizes, states = [], {}, {}
        else:
            new_state = state_from_arrays(arrays, self.reference, f"round {t} aggregate")
        self._record(t, clients, sizes, states, new_state)
        return arrays, metrics

    def _record(
        self,
        t: int,
        clients: list[int],
        sizes: dict[int, int],
        states: dict[int, State],
        new_state: State,
    ) -> None:
        assert self.history is not None
        every = int(self.cfg.fl.eval_every) if self.cfg is not None else 1
        evaluate_now = self.evaluator is not None and (t % every == 0 or t == self.num_rounds)
        metrics = self.evaluator(new_state) if evaluate_now else dict(NOT_EVALUATED)
        wall = time.perf_counter() - self._t0
        link = self.history.record_round(t, clients, sizes, states, new_state, metrics, wall)
        row: dict[str, Any] = {"round": t, **metrics}
        row.update(
            participants=clients,
            wall_s=wall,
            link_s=link["link_s"],
            cum_link_s=link["cum_link_s"],
            bytes=int(link["bytes"]),
        )
        self.metrics.append(row)
        append_jsonl(self.run_dir / "metrics.jsonl", row)
        acc = row.get("test_acc")
        log.info(
            "round %d recorded: clients %s%s",
            t,
            clients,
            "" if acc is None else f", test acc {acc:.4f}",
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluation messages."""
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Take the requests evaluation replies carry; the wrapped strategy aggregates."""
        replies = list(replies)
        for msg in replies:
            if msg.has_error() or "scaleflu" not in msg.content:
                continue
            try:
                self._identify(msg, f"evaluation {server_round}", int(server_round))
            except WireError as exc:
                log.warning("%s", exc)
        return self.inner.aggregate_evaluate(server_round, replies)

    # -- the run ---------------------------------------------------------------------------

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's round loop around the wrapped strategy, recorded; then serve the requests.

        The returned ``Result.arrays`` is the deployed model: the unlearned one when a request
        was served with ``deploy``, else the last aggregate.
        """
        self._open(initial_arrays, num_rounds)
        self.register(grid)
        try:
            result = super().start(
                grid,
                initial_arrays,
                num_rounds,
                timeout,
                train_config,
                evaluate_config,
                evaluate_fn,
            )
        except BaseException:
            self.close()
            raise
        self._finish()
        if self.serve_at_end:
            self.collect(grid)
        if self.serve_at_end and self.requests:
            self.serve_pending()
            self.notify(grid)
            deployed = next((s for s in reversed(self.served) if s.deployed), None)
            if deployed is not None:
                result.arrays = arrays_from_state(load_model(self.run_dir / "model.safetensors"))
        self.close()
        return result

    def _finish(self) -> None:
        """The run's final model, poison record and training outputs, as ``train`` writes."""
        assert self.history is not None
        save_model(self.history.final_model(), self.run_dir / "model.safetensors")
        if self.setup is not None:
            (self.run_dir / "poison.json").write_text(json.dumps(self.setup.poison.to_json()))
        write_training_outputs(self.metrics, self.run_dir, title=f"Flower: {self.run_dir.name}")

    def close(self) -> None:
        """Close the history store (the run directory stays readable by ``load_run``)."""
        if self.history is not None:
            self.history.close()
            self.history = None

    # -- serving ---------------------------------------------------------------------------

    def serve_pending(self) -> list[ServedRequest]:
        """Serve every queued request in arrival order (see :meth:`serve`)."""
        out = []
        while self.requests:
            q = self.requests.pop(0)
            served = self.serve(q)
            self._answers.setdefault(q.client, {})[q.request_id] = (
                f"served: {served.deployed}"
                if served.deployed
                else f"failed: {served.errors.get(self.method, 'not deployed')}"[:200]
            )
            out.append(served)
        return out

    def serve(
        self, request: QueuedRequest | UnlearnRequest | str, methods: Sequence[str] | None = None
    ) -> ServedRequest:
        """Unlearn ``request`` from the recorded run with ``method`` and the ``compare`` methods.

        Every method runs on the same run (the history before this request's erasure); each
        writes ``model.safetensors`` and ``result.json`` under ``run_dir/unlearn/<request>-
        <method>``; the audit rows (RA, FA, Avg AoI, costs, the protocol's MIA columns: the
        columns of Table II) go to ``side_by_side.json`` and ``.md``. With ``deploy`` the
        method's model becomes the run's final model and the requester's stored updates are
        erased (``scaleflu unlearn --erase``).
        """
        if self.config is None:
            raise ConfigError(
                "serving a request needs the scaleflu config of the federation (data, "
                "partition, model); this strategy was built with a model only"
            )
        queued = request if isinstance(request, QueuedRequest) else None
        if isinstance(request, QueuedRequest):
            req = request.request
        elif isinstance(request, str):
            req = parse_request(request)
        else:
            req = request
        names = [canonical_name(m) for m in (methods or (*self.compare, self.method))]
        if self.method in names:  # the deployed method last: its erasure changes the history
            names = [m for m in names if m != self.method] + [self.method]
        self.close()
        run = load_run(self.run_dir)
        served = ServedRequest(queued, req.text, out_dir=self.run_dir / "unlearn")
        try:
            for name in names:
                log.info("serving %s with %s", req.text, name)
                try:
                    done = run_unlearning(
                        self.run_dir,
                        req,
                        name,
                        overrides=list(self.unlearn_overrides),
                        progress=self.progress,
                        run=run,
                    )
                except Exception as exc:  # a method that fails must not take the server down
                    log.error("serving %s with %s failed: %s", req.text, name, exc)
                    served.errors[name] = f"{type(exc).__name__}: {exc}"
                    continue
                if done.result.details.get("aoi_time_avg_s") is None and (
                    "rollout" in done.result.details
                ):  # Table II's Avg AoI column for SCALE, as the harness computes it
                    annotate(done.result, replay_scale_trace(done.ctx, done.result.details))
                erase = self.deploy and name == self.method
                out = self.run_dir / "unlearn" / f"{req.slug}-{name}"
                write_unlearning(done, req.text, name, out, erase)
                res = done.result.to_dict()
                served.results[name] = res
                served.audit.append(audit_row(res, run.cfg, name))
                if erase:
                    save_model(done.state, self.run_dir / "model.safetensors")
                    served.deployed = name
                    served.erasure = done.result.erasure
        finally:
            run.history.close()
        self.served.append(served)
        write_side_by_side(self.served, self.run_dir / "unlearn")
        return served


# -- the audit table -----------------------------------------------------------------------------


def audit_row(
    result: Mapping[str, Any], cfg: Mapping[str, Any], method: str | None = None
) -> dict[str, Any]:
    """One method's row of Table II from its result: RA, FA (the experiment's FA metric), Avg
    AoI, test accuracy, costs, the protocol's MIA columns (``scaleflu.experiments.report``)."""
    exp = (cfg.get("experiment") or {}) if isinstance(cfg, Mapping) else {}
    fa_metric = str(exp.get("fa_metric") or "fa_protocol")
    aoi_metric = str(exp.get("aoi_metric") or "time_avg")
    name = str(method or result["method"])
    row: dict[str, Any] = {"method": name, "label": METHOD_LABELS.get(name, name)}
    row.update(cell_values(result, fa_metric, aoi_metric))
    row["protocol"] = result.get("protocol")
    return row


def write_side_by_side(served: Sequence[ServedRequest], out_dir: Path) -> Path:
    """``side_by_side.json`` and ``side_by_side.md``: every served request's audit rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "side_by_side.json").write_text(json.dumps([s.to_json() for s in served], indent=2))
    cols = ("RA", "FA", "AoI_s", "test_acc", "wall_s", "link_s", "bytes", "fl_rounds")
    lines = []
    for s in served:
        lines += [f"## {s.text}" + (f" (deployed: {s.deployed})" if s.deployed else ""), ""]
        lines.append("| method | " + " | ".join(cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for row in s.audit:
            lines.append(f"| {row['label']} | " + " | ".join(fmt(row.get(c)) for c in cols) + " |")
        lines.append("")
    path = out_dir / "side_by_side.md"
    path.write_text("\n".join(lines))
    return path
