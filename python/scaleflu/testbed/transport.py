"""Links for the testbed apps: the radio back-ends of scaleflu.radio, or a frame hub over ZeroMQ.

``make_testbed_link`` picks the back-end by name:

* ``ofdm-zmq`` / ``uhd`` / ``ofdm-loopback``: ``scaleflu.radio.links.make_link`` (GNU Radio OFDM
  PHY; imported lazily so this module works without GNU Radio).
* ``frames``: :class:`FrameHubLink`, an :class:`~scaleflu.link.ArqLink` whose frames travel
  through a :class:`FrameHub` (a ZeroMQ broker that behaves like a shared medium with the
  seeded impairments of :class:`~scaleflu.link.ChannelModel`: loss, bit errors, duplicates,
  reordering, delay, serialisation rate). No PHY, so it is cheap on small machines; the ARQ,
  fragmentation and every byte above the PHY are the same as over the radio.
"""

from __future__ import annotations

import heapq
import logging
import random
import struct
import threading
import time
from typing import Any

from scaleflu.link import ArqConfig, ArqLink, ChannelModel, Link

log = logging.getLogger(__name__)

LINK_KINDS = ("frames", "ofdm-zmq", "ofdm-loopback", "uhd")
# The hub serialises every node's frames at one rate, like the radio: with several uploads at
# once, round trips reach a second and the ARQ's default 0.5 s initial RTO fires for most of
# the first window (demo: 13.6 MB on air for 5.9 MB of messages; 6.2 MB with these). Long initial
# timers cost little, losses are repaired by the ACK bitmaps' fast retransmit (as for the OFDM
# back-ends, scaleflu.radio.links.OFDM_ARQ_DEFAULTS).
FRAMES_ARQ_DEFAULTS: dict[str, Any] = {"window": 32, "initial_rto": 3.0, "min_rto": 0.6}
_NODE = struct.Struct(">H")


class FrameHub:
    """A shared simulated medium between processes: every frame reaches every other node."""

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:0",
        model: ChannelModel | None = None,
        seed: int = 0,
    ) -> None:
        import zmq

        self.model = model or ChannelModel()
        self.rng = random.Random(seed)
        self._ctx = zmq.Context.instance()
        self._router = self._ctx.socket(zmq.ROUTER)
        # no handover: a second connection claiming a node's identity cannot take its frames
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 0)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(address)
        self.address = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self._nodes: dict[int, float] = {}  # node -> last seen
        self._events: list[tuple[float, int, int, bytes]] = []
        self._n = 0
        self._busy_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frame-hub", daemon=True)
        self._thread.start()
        log.info("frame hub on %s (%s)", self.address, self.model)

    def close(self) -> None:
        """Stop the hub thread and close its socket."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._router.close(0)

    def _ingest(self, node: int, raw: bytes) -> None:
        self.frames_in += 1
        self.bytes_in += len(raw)
        now = time.monotonic()
        start = now
        if self.model.rate_bytes_per_s:
            start = max(now, self._busy_until) + len(raw) / self.model.rate_bytes_per_s
            self._busy_until = start
        for dst in self._nodes:
            if dst == node:
                continue
            for delay, data, _held in self.model.impair(raw, self.rng):
                self._n += 1
                heapq.heappush(self._events, (start + delay, self._n, dst, data))

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            now = time.monotonic()
            while self._events and self._events[0][0] <= now:
                _, _, dst, data = heapq.heappop(self._events)
                try:
                    self._router.send_multipart([b"R" + _NODE.pack(dst), data], zmq.NOBLOCK)
                    self.frames_out += 1
                except zmq.ZMQError:
                    pass
            wait = 100.0 if not self._events else max(0.0, self._events[0][0] - now) * 1000
            if not poller.poll(timeout=min(100.0, wait)):
                continue
            while True:
                try:
                    ident, payload = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                except ValueError:  # wrong part count: ignore
                    continue
                if len(ident) != 3 or ident[:1] not in (b"R", b"T"):
                    continue
                node = _NODE.unpack(ident[1:])[0]
                if ident[:1] == b"R":  # the node's receive socket: a keep-alive
                    self._nodes[node] = time.monotonic()
                elif payload:
                    self._ingest(node, payload)


class FrameHubLink(ArqLink):
    """An ArqLink whose frames go through a :class:`FrameHub` over ZeroMQ."""

    def __init__(
        self, node_id: int, hub: str, config: ArqConfig | None = None, **overrides: Any
    ) -> None:
        import zmq

        self._zctx = zmq.Context.instance()
        # Two sockets, one per thread (ZeroMQ sockets are not thread-safe): frames go out on
        # "T<node>" from whatever thread the ARQ transmits on; "R<node>" receives in _rx_loop.
        self._tx = self._zctx.socket(zmq.DEALER)
        self._tx.setsockopt(zmq.IDENTITY, b"T" + _NODE.pack(node_id))
        self._tx.setsockopt(zmq.LINGER, 0)
        self._tx.setsockopt(zmq.SNDHWM, 100000)
        self._tx.connect(hub)
        self._sock = self._zctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, b"R" + _NODE.pack(node_id))
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(hub)
        self._sock.send(b"")  # tell the hub we are here
        self._tx_lock = threading.Lock()
        self._stop = threading.Event()
        super().__init__(node_id, self._transmit, config=config, **overrides)
        self._rx = threading.Thread(target=self._rx_loop, name=f"hub-rx-{node_id}", daemon=True)
        self._rx.start()

    def _transmit(self, raw: bytes) -> None:
        import zmq

        with self._tx_lock:
            try:
                self._tx.send(raw, zmq.NOBLOCK)
            except zmq.ZMQError:
                log.debug("hub link %d: frame dropped at the socket", self.node_id)

    def _rx_loop(self) -> None:
        import zmq

        last_ping = time.monotonic()
        while not self._stop.is_set():
            if self._sock.poll(50):
                while True:
                    try:
                        frame = self._sock.recv(zmq.NOBLOCK)
                    except zmq.ZMQError:
                        break
                    if frame:
                        self.feed(frame)
            if time.monotonic() - last_ping > 1.0:
                self._sock.send(b"", zmq.NOBLOCK)
                last_ping = time.monotonic()

    def close(self) -> None:
        """Close the link and its socket."""
        super().close()
        self._stop.set()
        self._rx.join(timeout=2.0)
        self._sock.close(0)
        with self._tx_lock:
            self._tx.close(0)


def make_testbed_link(kind: str, node_id: int, **opts: Any) -> Link:
    """A Link for node ``node_id``: ``frames`` (needs ``hub=``) or a scaleflu.radio back-end.

    ``frames`` uses ``hub`` only. The radio kinds hand every option that is not None to
    ``scaleflu.radio.links.make_link``: ``ofdm-zmq`` (``peers``, ``base_port``, ``snr_db``,
    ``drop_rate``, ``cfo``, ``seed``), ``uhd`` (``tx_args``, ``rx_args``, ``freq``, ``samp_rate``,
    ``tx_gain``, ``rx_gain``, ``tx_subdev``, ``rx_subdev``, ``clock_source``, ``time_source``,
    ``lo_offset``), ``ofdm-loopback`` (one process only). ARQ options go in ``arq`` (a dict).
    """
    arq = dict(opts.pop("arq", None) or {})
    clean = {k: v for k, v in opts.items() if v is not None}
    if kind == "frames":
        hub = clean.get("hub")
        if not hub:
            raise ValueError("the frames link needs hub='tcp://host:port'")
        return FrameHubLink(node_id, hub, config=ArqConfig(**{**FRAMES_ARQ_DEFAULTS, **arq}))
    if kind in ("ofdm-zmq", "ofdm-loopback", "uhd"):
        try:
            from scaleflu.radio import links as radio_links  # noqa: PLC0415 (GNU Radio, lazily)
        except ImportError as exc:
            raise RuntimeError(
                f"link {kind!r} needs scaleflu.radio.links (GNU Radio): {exc}; use --link frames"
            ) from exc
        radio_kind = {"ofdm-zmq": "zmq", "ofdm-loopback": "ofdm_loopback", "uhd": "uhd"}[kind]
        clean.pop("hub", None)
        if kind == "uhd" and "time_source" in clean:
            import inspect

            if "time_source" not in inspect.signature(radio_links.UhdLink).parameters:
                log.warning(
                    "time source %r ignored: scaleflu.radio.UhdLink has no time_source option",
                    clean.pop("time_source"),
                )
        return radio_links.make_link(radio_kind, node_id, **clean, **arq)
    raise ValueError(f"unknown link {kind!r}; choose one of {', '.join(LINK_KINDS)}")


def link_stats(link: Link) -> dict[str, Any]:
    """ARQ counters of a link when it has them (bytes on air, retransmissions), else {}."""
    stats = getattr(link, "stats", None)
    if callable(stats):
        try:
            return dict(stats())
        except Exception:  # a back-end without counters
            return {}
    return {}
