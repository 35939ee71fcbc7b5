"""The ClientApp side: say who you are, ask to be forgotten, hear the server's answer.

A ClientApp that works with :class:`~scaleflu.flower.strategy.UnlearningStrategy` changes in
two places::

    from scaleflu.flower import client as sfl

    app = ClientApp()
    sfl.add_registration(app, client_id=lambda ctx: int(ctx.node_config["partition-id"]),
                         num_examples=lambda ctx: len(my_partition(ctx)))

    @app.train()
    def train(msg, context):
        ...                                            # local training as before
        if user_wants_out:
            sfl.request_forget(context, "client")      # or "class", classes=(3,); "sample", 0.1
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"num-examples": n})})
        return sfl.reply(msg, context, content, client_id=my_id)

``request_forget`` only queues the request in the node's ``context.state`` (Flower keeps it for
the run); :func:`reply` attaches every queued request to the reply, in each reply until the
server answered it (a lost reply loses nothing), and reads the server's answers from the
message it replies to (:func:`answers`: ``queued``, ``refused: <why>``, then ``served:
<method>``). After its last round the server asks every node for what it holds (the
``collect`` query), serves the requests, and sends the answers (``notify``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from scaleflu.flower.wire import (
    IDENTITY_KEY,
    REGISTER_ACTION,
    ClientRequest,
    identity_record,
    read_acks,
    read_phase,
    request_text,
)

log = logging.getLogger(__name__)

_STATE = "scaleflu-requests"  # context.state: every request (id, text, status)
PENDING = "pending"  # not answered by the server yet

__all__ = [
    "add_registration",
    "answers",
    "pending_requests",
    "reply",
    "request_forget",
]


def _read(context: Context) -> tuple[list[int], list[str], list[str], int]:
    """(ids, texts, statuses, next id) of this node's requests."""
    rec = context.state.get(_STATE) if _STATE in context.state else None
    if not isinstance(rec, ConfigRecord):
        return [], [], [], 1
    ids = [int(i) for i in (rec.get("ids") or [])]
    texts = [str(t) for t in (rec.get("texts") or [])]
    status = [str(t) for t in (rec.get("status") or [])]
    return ids, texts, status, int(rec.get("next-id", 1))


def _write(
    context: Context, ids: list[int], texts: list[str], status: list[str], next_id: int
) -> None:
    rec: dict[str, int | list[int] | list[str]] = {"next-id": int(next_id)}
    if ids:  # Flower cannot serialise an empty list (its element type is unknown)
        rec["ids"], rec["texts"], rec["status"] = ids, texts, status
    context.state[_STATE] = ConfigRecord(rec)


def request_forget(
    context: Context,
    kind: str = "client",
    classes: Sequence[int] = (),
    fraction: float | None = None,
    poisoned: bool = False,
) -> int:
    """Queue a request to forget this client's data; returns the request's id.

    ``kind``: ``client`` (all of it: the client leaves), ``class`` with ``classes`` (those
    classes of its data), ``sample`` with ``fraction`` in (0, 1] (that share of its samples,
    poisoned ones first) or ``poisoned=True``. Sent with the next :func:`reply`. Asking again
    for what is pending, queued or served returns that request's id (it is served once); a
    refused or failed request may be asked again.
    """
    text = request_text(kind, classes, fraction, poisoned)
    ids, texts, status, next_id = _read(context)
    for rid, t, st in zip(ids, texts, status, strict=True):
        if t == text and not st.startswith(("refused", "failed")):
            return rid
    ids.append(next_id)
    texts.append(text)
    status.append(PENDING)
    _write(context, ids, texts, status, next_id + 1)
    log.info("unlearning request %d queued: %s", next_id, text)
    return next_id


def pending_requests(context: Context) -> list[ClientRequest]:
    """The requests not yet answered by the server (sent with every reply)."""
    ids, texts, status, _ = _read(context)
    return [
        ClientRequest(i, t) for i, t, st in zip(ids, texts, status, strict=True) if st == PENDING
    ]


def answers(context: Context) -> dict[int, str]:
    """The server's answers so far: request id -> ``queued``, ``refused: <why>``, ``served:
    <method>`` or ``failed: <why>``."""
    ids, _, status, _ = _read(context)
    return {i: st for i, st in zip(ids, status, strict=True) if st != PENDING}


def _take_answers(msg: Message, context: Context) -> None:
    """Record the answers ``msg`` carries for this node's requests."""
    if not msg.has_content():
        return
    got = read_acks(msg.content)
    if not got:
        return
    ids, texts, status, next_id = _read(context)
    for rid, answer in got.items():
        if rid in ids:  # an answer for another id is not about this client's requests
            status[ids.index(rid)] = answer
            log.info("unlearning request %d: %s", rid, answer)
    _write(context, ids, texts, status, next_id)


def reply(
    msg: Message,
    context: Context,
    content: RecordDict,
    client_id: int,
    num_examples: int | None = None,
) -> Message:
    """The reply to ``msg`` with ``content``, this client's identity and its pending requests.

    Reads the server's answers carried by ``msg`` first (answered requests are not sent again).
    """
    _take_answers(msg, context)
    content[IDENTITY_KEY] = identity_record(client_id, num_examples, pending_requests(context))
    return Message(content, reply_to=msg)


def add_registration(
    app: ClientApp,
    client_id: Callable[[Context], int],
    num_examples: Callable[[Context], int] | None = None,
    on_query: Callable[[str, int, Context], None] | None = None,
) -> None:
    """Answer the strategy's queries (``query.scaleflu``) on ``app``.

    ``client_id(context)``: this node's client index in the federation's partition;
    ``num_examples(context)``: its number of training samples M_n (checked by the server
    against the partition its config describes). ``on_query(phase, server_round, context)``
    runs first: at ``collect``, after the last round, a client may still ask
    (:func:`request_forget`); the reply carries what is pending.
    """

    @app.query(REGISTER_ACTION)
    def _register(msg: Message, context: Context) -> Message:
        if on_query is not None:
            phase, t = read_phase(msg.content)
            on_query(phase, t, context)
        size = None if num_examples is None else int(num_examples(context))
        return reply(msg, context, RecordDict(), int(client_id(context)), size)
