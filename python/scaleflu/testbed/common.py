"""Pieces the edge server and the robots share: model (de)serialisation, config, sending."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from scaleflu.config import as_config
from scaleflu.link import Encoding, Link
from scaleflu.link.arq import SendHandle
from scaleflu.link.wire import decode_tensors, encode_tensors
from scaleflu.testbed.protocol import SERVER_ID, CounterSource, Envelope, MsgType, derive_key, seal

log = logging.getLogger(__name__)

ENCODINGS = {"raw": Encoding.RAW, "fp16": Encoding.FP16, "int8": Encoding.INT8}


def federation_config(cfg: Mapping[str, Any]) -> Any:
    """A checked copy of ``cfg`` as the testbed's federation runs it: ``fl.rounds`` :=
    ``testbed.rounds`` (also the lr schedule's T), the same on the server and on every robot."""
    out = as_config(as_config(cfg).to_dict())
    out.fl.rounds = int(out.testbed.rounds)
    return out


def link_clock(link: Any) -> Callable[[], float]:
    """The clock of a link's timers, for every wait on the link: the medium's virtual time on
    ``ofdm-shared`` (which runs at a fraction of real time while the medium is busy; a wait on
    the wall clock there gives up on peers that are only slow), else ``time.monotonic``."""
    return getattr(link, "virtual_time", time.monotonic)


class LinkDeadline:
    """``timeout`` seconds from now on a link's clock (:func:`link_clock`).

    A backstop on the wall clock for a clock that does not move at all (a shared medium whose
    broker waits for a node that never joined, or that is gone): the deadline also passes once
    ``timeout`` wall seconds went by without the clock advancing. A medium that runs slowly
    (its virtual time moves) is waited for.
    """

    def __init__(self, timeout: float, clock: Callable[[], float]) -> None:
        self.timeout = float(timeout)
        self.clock = clock
        self.start = clock()
        self._wall = time.monotonic()

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        now = self.clock()
        if now - self.start >= self.timeout:
            return True
        return now == self.start and time.monotonic() - self._wall >= self.timeout


def wait_on_clock(handle: Any, timeout: float, clock: Callable[[], float]) -> bool:
    """Wait until a send ``handle`` is done or ``timeout`` seconds of ``clock`` have passed
    (:class:`LinkDeadline`); True when done. On the shared medium the ARQ ends every send at its
    virtual deadline (a lost medium cancels them), so this returns whatever the medium's speed."""
    end = LinkDeadline(timeout, clock)
    while not handle.done():
        if end.expired():
            return False
        handle.wait(0.2)
    return True


def arrays(state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The wire codec's view of a CPU state dict: numpy arrays sharing the tensors' memory."""
    return {k: v.detach().numpy() for k, v in state.items()}


def tensors(decoded: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Decoded wire arrays as a state dict sharing their memory (the decoder's arrays are its
    own, writable copies)."""
    return {k: torch.from_numpy(np.asarray(v)) for k, v in decoded.items()}


def encode_state(
    state: Mapping[str, np.ndarray],
    encoding: str = "raw",
    reference: Mapping[str, np.ndarray] | None = None,
    groups: int = 8,
) -> bytes:
    """Wire-encode a state dict by encoding name; with a reference only changed groups go."""
    return encode_tensors(state, encoding=ENCODINGS[encoding], groups=groups, reference=reference)


# Decode a wire-encoded state dict (a delta is applied to ``reference``); WireError otherwise.
decode_state = decode_tensors


def cast_like(
    state: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Decoded tensors in the dtypes of ``like`` (lossy encodings decode to float32 already)."""
    return {
        k: np.asarray(v).astype(like[k].dtype, copy=False) if k in like else v
        for k, v in state.items()
    }


def install_link_keys(
    link: Link, keys: Mapping[int, bytes], node_id: int, require_auth: bool = True
) -> bool:
    """Give the link a per-peer key, ``HKDF(K_r, "link", r)``, for each peer it talks to.

    On the server (``node_id`` 0) one key per robot in ``keys``; on robot r the key shared with
    the server. Links with per-peer keys (``set_peer_key``) then tag every DATA/ACK/NACK frame,
    so keyless nodes cannot forge link control or evict an authenticated robot's partial
    messages; with ``require_auth`` (``testbed.arq.require_auth``, on by default) the link also
    drops every frame of a node without a key: no ACK, NACK or reassembly for it. Returns False
    when the link has no such API.
    """
    setter = getattr(link, "set_peer_key", None)
    if setter is None:
        log.info("link %s has no per-peer keys; frames are authenticated above the link only",
                 type(link).__name__)  # fmt: skip
        return False
    if node_id == SERVER_ID:
        for r, k in keys.items():
            setter(r, derive_key(k, "link", r))
    else:
        setter(SERVER_ID, derive_key(keys[node_id], "link", node_id))
    auth = getattr(link, "set_require_auth", None)
    if auth is not None:
        try:
            auth(bool(require_auth))
        except NotImplementedError:
            log.info("link %s cannot refuse keyless frames", type(link).__name__)
    return True


class Endpoint:
    """Seals envelopes with a monotonic counter and sends them over a Link."""

    def __init__(self, link: Link, node_id: int) -> None:
        self.link = link
        self.node_id = node_id
        self.counter = CounterSource()
        self.sent_bytes = 0
        self.sent_messages = 0

    def build(
        self,
        mtype: MsgType,
        receiver: int,
        key: bytes,
        session: int,
        round_: int = 0,
        meta: dict[str, Any] | None = None,
        body: bytes = b"",
    ) -> bytes:
        """Sealed bytes of one envelope."""
        env = Envelope(
            mtype, session, round_, self.node_id, receiver, self.counter.next(), meta or {}, body
        )
        return seal(env, key)

    def send_raw(self, receiver: int, data: bytes, timeout: float) -> SendHandle:
        """Start sending already sealed bytes; returns the link's handle."""
        self.sent_bytes += len(data)
        self.sent_messages += 1
        return self.link.send_async(receiver, data, timeout)

    def send(
        self,
        mtype: MsgType,
        receiver: int,
        key: bytes,
        session: int,
        round_: int = 0,
        meta: dict[str, Any] | None = None,
        body: bytes = b"",
        timeout: float = 30.0,
    ) -> SendHandle:
        """Seal and start sending one envelope."""
        data = self.build(mtype, receiver, key, session, round_, meta, body)
        return self.send_raw(receiver, data, timeout)
