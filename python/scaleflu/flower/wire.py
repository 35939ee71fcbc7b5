"""What a scaleflu Flower client and the :class:`~scaleflu.flower.strategy.UnlearningStrategy`
exchange inside Flower's messages, and the checks every received value passes.

Three records ride in the ``RecordDict`` of ordinary Flower messages, beside the app's own
``"arrays"``, ``"metrics"`` and ``"config"``:

* ``"scaleflu"`` (a ``ConfigRecord``, in every reply of a scaleflu client): ``client-id`` (the
  client's index n in the federation's partition), ``num-examples`` (M_n; registration replies)
  and the client's pending unlearning requests about its own data, ``request-ids`` (integers the
  client chose) and ``requests`` (their text, below).
* ``"scaleflu-acks"`` (a ``ConfigRecord``, in the server's messages to one node): the request ids
  the server received, ``ids``, each with its answer in ``status`` (``queued`` or
  ``refused: <why>``); the client stops sending them.
* the strategy's queries: message type ``query.scaleflu`` (:data:`REGISTER_TYPE`) with a
  ``"scaleflu-query"`` record (``phase``: ``register`` before the first round, ``collect``
  after the last one to hear every client's pending requests, ``notify`` to deliver the final
  answers; ``server-round``), answered with the ``"scaleflu"`` record.

A client asks about its *own* data only, so its request text names no client:

==================  ===========================================================================
``client``          the client leaves the federation (``client:n``)
``class:3,5``       classes 3 and 5 of the client's data (``class:3,5@n``)
``sample:0.1``      a fraction of its samples, its poisoned ones first (``sample:n:0.1``)
``sample:poisoned`` exactly its poisoned samples (``sample:n:poisoned``)
==================  ===========================================================================

The server binds the text to the client the *sending node* registered as
(:meth:`ClientRequest.bind`), never to a client id inside the text, so no node can ask to
forget another's data. Everything received is hostile until checked: a malformed record, a
model with other keys or shapes or non-finite values, or a request that does not parse raises
:class:`WireError` with one line naming the node and what is wrong; the strategy logs it and
leaves that reply out (nothing else of the round is lost).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict

from scaleflu.unlearn.request import RequestError, UnlearnRequest

IDENTITY_KEY = "scaleflu"
ACKS_KEY = "scaleflu-acks"
REGISTER_ACTION = "scaleflu"
REGISTER_TYPE = f"{MessageType.QUERY}.{REGISTER_ACTION}"
PHASE_KEY = "scaleflu-query"  # ConfigRecord of a query.scaleflu message: phase, server-round
PHASE_REGISTER, PHASE_COLLECT, PHASE_NOTIFY = "register", "collect", "notify"
MAX_REQUESTS = 16  # pending requests one reply may carry
MAX_REQUEST_TEXT = 200  # characters of one request's text
QUEUED = "queued"

State = dict[str, torch.Tensor]

_CLASS_RE = re.compile(r"^class:(\d{1,6}(?:,\d{1,6}){0,63})$")
_SAMPLE_RE = re.compile(r"^sample:(poisoned|[0-9.eE+-]{1,24})$")


class WireError(ValueError):
    """A record received from a node is malformed or not allowed (one line: who and what)."""


@dataclass(frozen=True)
class ClientRequest:
    """A client's request about its own data: the id it chose and the request's text."""

    request_id: int
    text: str

    def __post_init__(self) -> None:
        check_request_text(self.text)

    def bind(self, client: int) -> UnlearnRequest:
        """The request for ``client`` (the sender's registered client), as the runtime's type."""
        n = int(client)
        text = self.text
        if text == "client":
            return UnlearnRequest("client", (n,), text=f"client:{n}")
        m = _CLASS_RE.match(text)
        if m:
            classes = tuple(int(c) for c in m.group(1).split(","))
            full = f"class:{m.group(1)}@{n}"
            return UnlearnRequest("class", (n,), classes, text=full)
        m = _SAMPLE_RE.match(text)
        assert m is not None  # check_request_text passed
        if m.group(1) == "poisoned":
            return UnlearnRequest("sample", (n,), poisoned_only=True, text=f"sample:{n}:poisoned")
        frac = float(m.group(1))
        return UnlearnRequest("sample", (n,), fraction=frac, text=f"sample:{n}:{m.group(1)}")


def request_text(
    kind: str = "client",
    classes: Sequence[int] = (),
    fraction: float | None = None,
    poisoned: bool = False,
) -> str:
    """The text of a client's own request (see the module docstring); RequestError if bad."""
    if kind == "client":
        if classes or fraction is not None or poisoned:
            raise RequestError("a client request takes no classes, fraction or poisoned")
        text = "client"
    elif kind == "class":
        if not classes:
            raise RequestError("a class request needs at least one class")
        text = "class:" + ",".join(str(int(c)) for c in classes)
    elif kind == "sample":
        if poisoned:
            text = "sample:poisoned"
        elif fraction is None:
            raise RequestError("a sample request needs a fraction in (0, 1] or poisoned=True")
        else:
            text = f"sample:{float(fraction)!r}"
    else:
        raise RequestError(f"unknown request kind {kind!r}; choose client, class or sample")
    check_request_text(text)
    return text


def check_request_text(text: object) -> str:
    """``text`` if it is a valid client-relative request (RequestError naming it otherwise)."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_REQUEST_TEXT:
        raise RequestError(f"request text must be 1..{MAX_REQUEST_TEXT} characters, got {text!r}")
    if text == "client" or _CLASS_RE.match(text):
        return text
    m = _SAMPLE_RE.match(text)
    if m:
        if m.group(1) == "poisoned":
            return text
        try:
            frac = float(m.group(1))
        except ValueError:
            frac = math.nan
        if 0.0 < frac <= 1.0:
            return text
        raise RequestError(f"request {text!r}: the fraction must be in (0, 1]")
    raise RequestError(
        f"request {text[:60]!r} is not client, class:C[,C..], sample:FRACTION or sample:poisoned"
    )


@dataclass(frozen=True)
class Identity:
    """What a reply's ``"scaleflu"`` record says: who the client is, its size, its requests."""

    client_id: int
    num_examples: int | None
    requests: tuple[ClientRequest, ...]
    bad_requests: tuple[tuple[int, str], ...] = ()  # (request id, why) of unparsable ones


def identity_record(
    client_id: int, num_examples: int | None = None, requests: Sequence[ClientRequest] = ()
) -> ConfigRecord:
    """The ``"scaleflu"`` record a client puts in its replies."""
    rec: dict[str, int | str | list[int] | list[str]] = {"client-id": int(client_id)}
    if num_examples is not None:
        rec["num-examples"] = int(num_examples)
    if requests:
        rec["request-ids"] = [int(r.request_id) for r in requests]
        rec["requests"] = [r.text for r in requests]
    return ConfigRecord(rec)


def _int(value: object, what: str, where: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise WireError(f"{where}: {what} must be an integer, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise WireError(f"{where}: {what} {int(value)} out of range {lo}..{hi}")
    return int(value)


def read_identity(content: RecordDict, where: str, num_clients: int | None = None) -> Identity:
    """The ``"scaleflu"`` record of a reply (WireError when missing or malformed).

    A request whose text does not parse is kept in ``bad_requests`` (the server answers it
    ``refused``) instead of failing the whole reply.
    """
    if IDENTITY_KEY not in content:
        raise WireError(
            f"{where}: the reply has no {IDENTITY_KEY!r} record (the ClientApp must answer "
            "through scaleflu.flower.client.reply)"
        )
    rec = content[IDENTITY_KEY]
    if not isinstance(rec, ConfigRecord):
        raise WireError(f"{where}: {IDENTITY_KEY!r} must be a ConfigRecord")
    hi = (num_clients - 1) if num_clients else 2**31 - 1
    client = _int(rec.get("client-id"), "client-id", where, 0, hi)
    size = rec.get("num-examples")
    num_examples = None if size is None else _int(size, "num-examples", where, 0)
    ids = rec.get("request-ids") or []
    texts = rec.get("requests") or []
    if not isinstance(ids, list) or not isinstance(texts, list) or len(ids) != len(texts):
        raise WireError(f"{where}: request-ids and requests must be lists of the same length")
    if len(ids) > MAX_REQUESTS:
        raise WireError(f"{where}: {len(ids)} requests in one reply (at most {MAX_REQUESTS})")
    good: list[ClientRequest] = []
    bad: list[tuple[int, str]] = []
    for rid, text in zip(ids, texts, strict=True):
        rid = _int(rid, "a request id", where, 0, 2**31 - 1)
        try:
            good.append(ClientRequest(rid, text))
        except RequestError as exc:
            bad.append((rid, str(exc)))
    return Identity(client, num_examples, tuple(good), tuple(bad))


def acks_record(answers: Mapping[int, str]) -> ConfigRecord:
    """The ``"scaleflu-acks"`` record: request id -> ``queued`` / ``refused: ...``."""
    ids = sorted(answers)
    return ConfigRecord({"ids": ids, "status": [answers[i][:MAX_REQUEST_TEXT] for i in ids]})


def read_phase(content: RecordDict) -> tuple[str, int]:
    """(phase, server-round) of a ``query.scaleflu`` message (``("register", 0)`` if absent)."""
    rec = content.get(PHASE_KEY) if PHASE_KEY in content else None
    if not isinstance(rec, ConfigRecord):
        return PHASE_REGISTER, 0
    return str(rec.get("phase", PHASE_REGISTER)), int(rec.get("server-round", 0) or 0)


def read_acks(content: RecordDict) -> dict[int, str]:
    """The answers in a server message (empty when it carries none or a malformed record)."""
    rec = content.get(ACKS_KEY) if ACKS_KEY in content else None
    if not isinstance(rec, ConfigRecord):
        return {}
    ids, status = rec.get("ids"), rec.get("status")
    if not isinstance(ids, list) or not isinstance(status, list) or len(ids) != len(status):
        return {}
    return {int(i): str(s) for i, s in zip(ids, status, strict=True)}


# -- models ----------------------------------------------------------------------------------


def arrays_from_state(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """A model state dict as Flower's ``ArrayRecord`` (CPU tensors, same keys and order)."""
    return ArrayRecord({k: v.detach().cpu() for k, v in state.items()})


def state_from_arrays(record: object, reference: Mapping[str, torch.Tensor], where: str) -> State:
    """A received ``ArrayRecord`` as a state dict shaped like ``reference`` (WireError if not).

    The keys must be ``reference``'s, each array of its shape, floating-point entries finite;
    values take ``reference``'s dtype (integer buffers such as BatchNorm's batch counter come
    back as integers even when an aggregator averaged them as floats).
    """
    if not isinstance(record, ArrayRecord):
        raise WireError(f"{where}: the model must be an ArrayRecord, got {type(record).__name__}")
    keys = list(record.keys())
    if set(keys) != set(reference):
        missing = sorted(set(reference) - set(keys))[:3]
        extra = sorted(set(keys) - set(reference))[:3]
        raise WireError(f"{where}: model keys differ (missing {missing}, unexpected {extra})")
    out: State = {}
    for k, ref in reference.items():
        try:
            arr = record[k].numpy()
        except Exception as exc:  # a malformed Array (bad bytes, unknown dtype)
            raise WireError(f"{where}: entry {k!r} does not decode: {exc}") from None
        if tuple(arr.shape) != tuple(ref.shape):
            raise WireError(
                f"{where}: entry {k!r} has shape {tuple(arr.shape)}, expected {tuple(ref.shape)}"
            )
        t = torch.from_numpy(np.array(arr, copy=True))
        if torch.is_floating_point(ref):
            if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
                raise WireError(f"{where}: entry {k!r} has dtype {t.dtype}, expected floats")
            t = t.to(ref.dtype)
            if not bool(torch.isfinite(t).all()):
                raise WireError(f"{where}: entry {k!r} holds NaN or Inf")
        else:
            t = t.round().to(ref.dtype) if t.is_floating_point() else t.to(ref.dtype)
        out[k] = t
    return out
