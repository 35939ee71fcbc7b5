"""FrameHub: a shared simulated medium between processes over ZeroMQ, and the links on it.

``FrameHub`` is a broker: every node connects two DEALER sockets (``T<node>`` to transmit,
``R<node>`` to receive) and the hub passes each frame to every other node through the seeded
impairments of a :class:`~scaleflu.link.ChannelModel` (loss, bit errors, duplicates, reordering,
delay). Two media:

* ideal (``shared=False``, the ``frames`` link kind): frames are serialised at
  ``rate_bytes_per_s`` in arrival order and never collide, as if a perfect scheduler existed;
* shared (``shared=True``, ``frames-shared``): one frequency. A frame occupies the medium for
  ``MacConfig.airtime(len, mcs)`` from the moment it reaches the hub (a node's own frames go
  back to back); two frames of different nodes that overlap in time collide and neither is
  delivered. The MAC (``scaleflu.link.mac`` through :class:`MacLink`) keeps scheduled traffic
  clear of that. With a :class:`HubPhy` the hub models the PHY at frame level: each link has a
  mean SNR and the medium's fading (``scaleflu.link.fading``, seeded, on the hub's clock), a
  frame is lost with the measured frame error rate of its MCS (or of the stock PHY) at its SNR
  (``scaleflu.link.mcs``), and the receiver gets the SNR it would measure, so the MAC adapts
  the MCS as over the radio.

No GNU Radio (pyzmq carries the frames). The link kinds ``frames``
and ``frames-shared`` (:mod:`scaleflu.linkkinds`) build the links with their defaults.
"""

from __future__ import annotations

import heapq
import logging
import random
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from .api import ArqLink
from .arq import ArqConfig
from .fading import FadingTrace
from .mac import MacConfig
from .maclink import MacLink
from .mcs import MCS_TABLE, STOCK, frame_error_rate
from .sim import ChannelModel

log = logging.getLogger(__name__)


@dataclass
class _HubTx:
    src: int
    start: float
    end: float
    collided: bool = False
    mcs: int | None = None


@dataclass(frozen=True)
class HubPhy:
    """The PHY a shared hub models at frame level (see the module docstring): every link's mean
    ``snr_db`` with ``fading`` ("none", "rician" with ``k_factor_db``, "rayleigh") at
    ``doppler_hz``, seeded; frames without an MCS are the stock PHY's."""

    snr_db: float = 20.0
    fading: str = "rician"
    k_factor_db: float = 6.0
    doppler_hz: float = 2.0
    seed: int = 0
    snr_error_db: float = 0.7  # the receiver's SNR estimate, give or take

    def __post_init__(self) -> None:
        if not -50.0 <= self.snr_db <= 100.0:
            raise ValueError("HubPhy snr_db must be within -50 .. 100 dB")
        FadingTrace(0, 0, 1, self.fading, self.k_factor_db, self.doppler_hz)  # checks fading


_NODE = struct.Struct(">H")
_SNR = struct.Struct("!f")  # the SNR a receiver measured, after the frame (HubPhy)
# A node's frames carry its send time (time.monotonic(), one clock for every process on the
# host) so that the shared medium places a burst when the node sent it, not when the hub's
# thread got to it (under CPU load that lag made frames sent apart overlap at the hub).
_STAMP = struct.Struct("!d")
# A stamp older than this is taken as this old: nobody can place a burst further back in time.
MAX_STAMP_AGE_S = 0.5


class FrameHub:
    """A simulated medium between processes: every frame reaches every other node (docstring)."""

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:0",
        model: ChannelModel | None = None,
        seed: int = 0,
        shared: bool = False,
        mac: MacConfig | None = None,
        phy: HubPhy | None = None,
    ) -> None:
        self.model = model or ChannelModel()
        self.shared = shared
        self.phy = phy
        self._fades: dict[tuple[int, int], FadingTrace] = {}
        self._t0 = time.monotonic()
        self.phy_lost = 0  # frames lost by the PHY model (their SNR at their MCS)
        self.bytes_by_mcs: dict[str, int] = {}
        rate = self.model.rate_bytes_per_s or MacConfig().rate_bytes_per_s
        self.mac = mac or MacConfig(rate_bytes_per_s=rate)
        self.collided_frames = 0
        self._recent: list[_HubTx] = []
        self._node_busy: dict[int, float] = {}
        self.rng = random.Random(seed)
        self._ctx = zmq.Context.instance()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 0)  # no identity takeover
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(address)
        self.address = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self._nodes: dict[int, float] = {}  # node -> last seen
        self._events: list[tuple[float, int, int, bytes, _HubTx | None, float | None]] = []
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

    def _ingest(
        self, node: int, raw: bytes, stamp: float | None = None, mcs: int | None = None
    ) -> None:
        self.frames_in += 1
        self.bytes_in += len(raw)
        now = time.monotonic()
        if stamp is not None:  # the sender's send time, never in the future, at most 0.5 s old
            now = min(now, max(stamp, now - MAX_STAMP_AGE_S))
        if self.shared:
            self._ingest_shared(node, raw, now, mcs)
            return
        start = now
        if self.model.rate_bytes_per_s:
            start = max(now, self._busy_until) + len(raw) / self.model.rate_bytes_per_s
            self._busy_until = start
        for dst in self._nodes:
            if dst == node:
                continue
            for delay, data, _held in self.model.impair(raw, self.rng):
                self._n += 1
                heapq.heappush(self._events, (start + delay, self._n, dst, data, None, None))

    def _snr(self, src: int, dst: int, t: float) -> float:
        """The SNR of link src -> dst at hub time ``t`` (HubPhy)."""
        assert self.phy is not None
        fade = self._fades.get((src, dst))
        if fade is None:
            p = self.phy
            fade = FadingTrace(p.seed, src, dst, p.fading, p.k_factor_db, p.doppler_hz)
            self._fades[(src, dst)] = fade
        return self.phy.snr_db + fade.gain_db(t - self._t0)

    def _ingest_shared(self, node: int, raw: bytes, now: float, mcs: int | None = None) -> None:
        start = max(now, self._node_busy.get(node, 0.0))
        tx = _HubTx(node, start, start + self.mac.airtime(len(raw), mcs), mcs=mcs)
        name = STOCK if mcs is None else MCS_TABLE[mcs].name
        self.bytes_by_mcs[name] = self.bytes_by_mcs.get(name, 0) + len(raw)
        self._node_busy[node] = tx.end
        self._recent = [t for t in self._recent if t.end > now - 1.0]
        for t in self._recent:
            if t.src != node and t.start < tx.end and t.end > tx.start:
                for x in (t, tx):
                    if not x.collided:
                        x.collided = True
                        self.collided_frames += 1
        self._recent.append(tx)
        for dst in self._nodes:
            if dst == node:
                continue
            snr = None
            if self.phy is not None:
                snr = self._snr(node, dst, (tx.start + tx.end) / 2)
                if self.rng.random() < frame_error_rate(
                    STOCK if mcs is None else mcs, snr, len(raw)
                ):
                    self.phy_lost += 1
                    continue
                snr += self.rng.gauss(0.0, self.phy.snr_error_db)
            for delay, data, _held in self.model.impair(raw, self.rng):
                self._n += 1
                heapq.heappush(self._events, (tx.end + delay, self._n, dst, data, tx, snr))

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            now = time.monotonic()
            while self._events and self._events[0][0] <= now:
                _, _, dst, data, tx, snr = heapq.heappop(self._events)
                if tx is not None and tx.collided:
                    continue
                parts = [b"R" + _NODE.pack(dst), data]
                if snr is not None:
                    parts.append(_SNR.pack(min(max(snr, -50.0), 100.0)))
                try:
                    self._router.send_multipart(parts, zmq.NOBLOCK)
                    self.frames_out += 1
                except zmq.ZMQError:
                    pass
            wait = 100.0 if not self._events else max(0.0, self._events[0][0] - now) * 1000
            if not poller.poll(timeout=min(100.0, wait)):
                continue
            while True:
                try:
                    parts = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                stamp = None
                mcs = None
                if len(parts) == 4 and len(parts[3]) == 1:  # [ident, stamp, frame, mcs]
                    mcs = parts[3][0]
                    if mcs >= len(MCS_TABLE):  # not an MCS of this table: ignore the frame
                        continue
                    parts = parts[:3]
                if len(parts) == 3 and len(parts[1]) == _STAMP.size:  # [ident, stamp, frame]
                    stamp = _STAMP.unpack(parts[1])[0]
                    if stamp != stamp:  # NaN: no stamp
                        stamp = None
                    parts = [parts[0], parts[2]]
                if len(parts) != 2:  # wrong part count: ignore
                    continue
                ident, payload = parts
                if len(ident) != 3 or ident[:1] not in (b"R", b"T"):
                    continue
                node = _NODE.unpack(ident[1:])[0]
                if ident[:1] == b"R":  # the node's receive socket: a keep-alive
                    self._nodes[node] = time.monotonic()
                elif payload:
                    self._ingest(node, payload, stamp, mcs)


class _HubIO:
    """ZeroMQ plumbing of a node on a hub (mixed into an ArqLink or a MacLink)."""

    node_id: int

    def _hub_open(self, node_id: int, hub: str) -> None:
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

    def _hub_start(self) -> None:
        self._rx = threading.Thread(
            target=self._rx_loop, name=f"hub-rx-{self.node_id}", daemon=True
        )
        self._rx.start()

    def _transmit(self, raw: bytes, mcs: int | None = None) -> None:
        parts = [_STAMP.pack(time.monotonic()), raw]
        if mcs is not None:  # the MAC's choice: the hub's PHY model times and loses it by it
            parts.append(bytes([mcs]))
        with self._tx_lock:
            try:
                self._tx.send_multipart(parts, zmq.NOBLOCK)
            except zmq.ZMQError:
                log.debug("hub link %d: frame dropped at the socket", self.node_id)

    def _rx_loop(self) -> None:
        last_ping = time.monotonic()
        while not self._stop.is_set():
            if self._sock.poll(50):
                while True:
                    try:
                        parts = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.ZMQError:
                        break
                    snr = None
                    if len(parts) == 2 and len(parts[1]) == _SNR.size:  # the hub's PHY model
                        snr = _SNR.unpack(parts[1])[0]
                        snr = snr if -50.0 <= snr <= 100.0 else None
                    if parts and parts[0]:
                        self.feed(parts[0], snr)  # type: ignore[attr-defined]
            if time.monotonic() - last_ping > 1.0:
                self._sock.send(b"", zmq.NOBLOCK)
                last_ping = time.monotonic()

    def _hub_close(self) -> None:
        self._stop.set()
        self._rx.join(timeout=2.0)
        self._sock.close(0)
        with self._tx_lock:
            self._tx.close(0)


class FrameHubLink(_HubIO, ArqLink):
    """An ArqLink whose frames go through a :class:`FrameHub` over ZeroMQ (no MAC)."""

    def __init__(
        self, node_id: int, hub: str, config: ArqConfig | None = None, **overrides: Any
    ) -> None:
        self._hub_open(node_id, hub)
        ArqLink.__init__(self, node_id, self._transmit, config=config, **overrides)
        self._hub_start()

    def close(self) -> None:
        """Close the link and its sockets."""
        ArqLink.close(self)
        self._hub_close()


class SharedHubLink(_HubIO, MacLink):
    """A MacLink on a shared-mode :class:`FrameHub`: the MAC schedules every frame."""

    def __init__(
        self,
        node_id: int,
        hub: str,
        config: ArqConfig | None = None,
        mac: MacConfig | None = None,
        server_id: int = 0,
        members: tuple[int, ...] = (),
        seed: int | None = None,
        **overrides: Any,
    ) -> None:
        self._hub_open(node_id, hub)
        MacLink.__init__(
            self,
            node_id,
            self._transmit,
            config=config,
            mac=mac,
            server_id=server_id,
            members=members,
            seed=seed,
            **overrides,
        )
        self._hub_start()

    def close(self) -> None:
        """Close the link and its sockets."""
        MacLink.close(self)
        self._hub_close()
