"""Link back-ends over GNU Radio OFDM: in-process loopback, cross-process ZeroMQ, and UHD.

All three implement ``scaleflu.link.Link`` with the same stack per node::

    send() -> link_arq -> ofdm_link_tx (frame_builder, OFDM, zero padding) -> medium
    medium -> ofdm_link_rx (OFDM, header guard, frame_parser) [-> frame_drop] -> link_arq -> recv()

* ``OfdmLoopbackLink``: every node lives in one flowgraph of one process (an
  ``OfdmLoopbackNetwork``); each directed pair of nodes that talk has its own
  channels.channel_model (AWGN at ``snr_db``, ``cfo``, multipath ``taps``) and its own receiver,
  so there are no collisions (ideal FDMA). ``topology="star"`` connects the hub (server, node 0)
  with every other node; ``"mesh"`` connects all pairs.
* ``ZmqOfdmLink``: one node per process. Its transmitter's samples go to a ZeroMQ PUB socket
  that the node *binds* on ``tcp://{bind}:{base_port + node_id}``; for each peer it *connects* a
  SUB socket to ``tcp://{host}:{base_port + peer}`` and runs that peer's samples through a
  channel model and its own receiver. Start order does not matter (ZeroMQ reconnects; frames
  published before a subscriber joined are lost and the ARQ resends them).
* ``SharedMediumLink`` (kind ``"ofdm-shared"``, scaleflu.radio.medium): one node per process
  on ONE simulated frequency; a broker adds every transmitter into one sample stream in virtual
  sample time and gives each receiver the sum through its own per-link channel (path loss, CFO,
  timing/sample-rate offset, fading, noise), so bursts that overlap collide. The per-pair
  ``zmq`` and ``ofdm_loopback`` kinds above are *ideal FDMA*: no collisions ever.
* ``UhdLink``: a real radio. TX and RX device args are separate because the testbed's edge
  server receives with a USRP 2955 (X310 + TwinRX, receive only) and transmits with a 2900
  (B200). One receiver hears every node on the frequency.

``make_link(kind, node_id, **opts)`` builds any of them (and ``"memory"``, the pure-Python
MemoryChannel) for the apps; see its docstring for the options.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from gnuradio import blocks, channels, gr, zeromq

from scaleflu.link.api import Link, MemoryChannel, message_bytes
from scaleflu.link.arq import SendHandle
from scaleflu.link.wire import Message

from .blocks import frame_drop, link_arq
from .ofdm import (
    DEFAULT_POST_PADDING,
    burst_demux_available,
    ofdm_link_rx,
    ofdm_link_tx,
    samples_per_frame,
)

__all__ = [
    "ChannelConfig",
    "GrLink",
    "OfdmLoopbackLink",
    "OfdmLoopbackNetwork",
    "PhyConfig",
    "UhdLink",
    "ZmqOfdmLink",
    "burst_power",
    "close_networks",
    "make_link",
    "phy_rate_bytes_per_s",
]

logger = logging.getLogger(__name__)

DEFAULT_ZMQ_BASE_PORT = 52000


@dataclass(frozen=True)
class PhyConfig:
    """OFDM parameters shared by transmitter and receiver (both ends must agree)."""

    fft_len: int = 64
    cp_len: int = 16
    bps_header: int = 1  # BPSK header
    bps_payload: int = 2  # QPSK payload
    scramble_bits: bool = True
    mtu: int = 1500
    post_padding: int = DEFAULT_POST_PADDING
    min_output_buffer: int | None = None
    # None: the stock gr-digital chain above (uncoded, the paper's PHY); an MCS name, index or
    # "adaptive": the coded PHY (scaleflu.radio.coded_ofdm; fft_len and bps_* do not apply)
    mcs: int | str | None = None

    def tx(self, node_id: int, amplitude: float = 1.0) -> ofdm_link_tx:
        """A transmitter for ``node_id``."""
        if self.mcs is not None:
            from .coded_ofdm import coded_ofdm_tx

            return coded_ofdm_tx(
                mtu=self.mtu,
                src=node_id,
                mcs=self.mcs,
                cp_len=self.cp_len,
                post_padding=self.post_padding,
                amplitude=amplitude,
            )
        return ofdm_link_tx(
            mtu=self.mtu,
            src=node_id,
            fft_len=self.fft_len,
            cp_len=self.cp_len,
            bps_header=self.bps_header,
            bps_payload=self.bps_payload,
            scramble_bits=self.scramble_bits,
            post_padding=self.post_padding,
            amplitude=amplitude,
            min_output_buffer=self.min_output_buffer,
        )

    def rx(
        self, node_id: int, raw_frames: bool = False, blocking_demux: bool | None = None
    ) -> ofdm_link_rx:
        """A receiver that passes frames addressed to ``node_id`` (or broadcast); with
        ``raw_frames`` whole frames (for link_arq, which then re-encodes nothing in Python);
        ``blocking_demux`` as in :class:`ofdm_link_rx` (None: ours when compiled, for the
        simulated per-pair links whose receivers get bursts only; radios and the shared
        medium pass False)."""
        if blocking_demux is None:
            blocking_demux = burst_demux_available()
        if self.mcs is not None:
            from .coded_ofdm import coded_ofdm_rx

            return coded_ofdm_rx(
                node_id=node_id,
                mtu=self.mtu,
                cp_len=self.cp_len,
                raw_frames=raw_frames,
                blocking_demux=blocking_demux,
                min_output_buffer=self.min_output_buffer,
            )
        return ofdm_link_rx(
            node_id=node_id,
            fft_len=self.fft_len,
            cp_len=self.cp_len,
            bps_header=self.bps_header,
            bps_payload=self.bps_payload,
            scramble_bits=self.scramble_bits,
            mtu=self.mtu,
            min_output_buffer=self.min_output_buffer,
            raw_frames=raw_frames,
            blocking_demux=blocking_demux,
        )


@dataclass(frozen=True)
class ChannelConfig:
    """Simulated channel of one directed pair: AWGN, carrier offset, multipath, frame loss."""

    snr_db: float | None = 20.0  # per-sample SNR over the burst power; None = no noise
    cfo: float = 0.0  # normalised frequency offset (cycles per sample; 1/64 = one subcarrier)
    taps: tuple[complex, ...] = (1.0,)  # multipath FIR, normalised to unit energy
    epsilon: float = 1.0  # sample-clock ratio (1.0 = none)
    drop_rate: float = 0.0  # fraction of received frames dropped by frame_drop (seeded)
    seed: int = 0

    def normalised_taps(self) -> list[complex]:
        """Taps scaled to unit energy so the channel keeps the signal power."""
        t = np.asarray(self.taps, dtype=np.complex128)
        e = float(np.sum(np.abs(t) ** 2))
        if e <= 0:
            raise ValueError("channel taps must not all be zero")
        return [complex(x) for x in t / math.sqrt(e)]


@functools.lru_cache(maxsize=16)
def burst_power(phy: PhyConfig = PhyConfig()) -> float:  # noqa: B008 - frozen dataclass
    """Mean power of the transmitter's samples over a full-size burst at amplitude 1 (measured)."""
    import pmt

    tb = gr.top_block()
    tx = phy.tx(0)
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    payload = np.random.default_rng(0).integers(0, 256, phy.mtu - 26, dtype=np.uint8)
    tb.start()
    tx.framer.to_basic_block()._post(
        pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(payload), payload))
    )
    want = samples_per_frame(phy.mtu, phy.fft_len, phy.cp_len, phy.bps_payload, phy.post_padding)
    for _ in range(500):
        if len(sink.data()) >= want:
            break
        threading.Event().wait(0.005)
    tb.stop()
    tb.wait()
    x = np.asarray(sink.data(), dtype=np.complex64)
    x = x[: max(1, len(x) - phy.post_padding)]
    if not len(x):
        raise RuntimeError("could not measure the transmitter's burst power")
    return float(np.mean(np.abs(x) ** 2))


def phy_rate_bytes_per_s(phy: PhyConfig, samp_rate: float) -> float:
    """Frame bytes per second the PHY carries back to back at ``samp_rate`` (with padding)."""
    return (
        phy.mtu
        * samp_rate
        / samples_per_frame(phy.mtu, phy.fft_len, phy.cp_len, phy.bps_payload, phy.post_padding)
    )


def _channel_block(ch: ChannelConfig, power: float, seed: int) -> channels.channel_model:
    nv = 0.0 if ch.snr_db is None else math.sqrt(power / 10 ** (ch.snr_db / 10.0))
    return channels.channel_model(
        noise_voltage=nv,
        frequency_offset=ch.cfo,
        epsilon=ch.epsilon,
        taps=ch.normalised_taps(),
        noise_seed=seed,
        block_tags=False,
    )


class GrLink(Link):
    """``Link`` over a link_arq block inside a running flowgraph (base of the radio back-ends)."""

    def __init__(self, arq: link_arq, on_close: Callable[[], None] | None = None) -> None:
        self.arq = arq
        self.node_id = arq.node_id
        self._on_close = on_close
        self._closed = False

    def send_async(
        self, peer: int, message: bytes | Message, timeout: float | None = None
    ) -> SendHandle:
        """Start sending; see Link.send_async."""
        return self.arq.link.send_async(peer, message_bytes(message, self.node_id, peer), timeout)

    def _wait_limit(self, timeout: float | None) -> float | None:
        return (self.arq.config.deadline if timeout is None else timeout) + 5.0

    def cancel(self, handle: SendHandle, reason: str = "cancelled") -> None:
        """Fail a pending send now."""
        self.arq.link.cancel(handle, reason)

    def set_peer_key(self, peer: int, key: bytes | None) -> None:
        """Authenticate every frame exchanged with ``peer`` (see ArqEndpoint.set_peer_key)."""
        self.arq.link.set_peer_key(peer, key)

    def recv(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """Next delivered (src, payload) or None after ``timeout``."""
        return self.arq.link.recv(timeout)

    def receiving_from(self, peer: int) -> bool:
        """Whether a message from ``peer`` is being reassembled (see Link.receiving_from)."""
        return self.arq.link.receiving_from(peer)

    def stats(self) -> dict[str, Any]:
        """ARQ and reassembly counters of this node."""
        return self.arq.stats()

    def close(self) -> None:
        """Fail pending sends and release the node (the flowgraph stops with its last node)."""
        if self._closed:
            return
        self._closed = True
        self.arq.link.close()
        if self._on_close is not None:
            self._on_close()


# ARQ defaults for the OFDM back-ends. Frames wait in the transmitter's queue and GNU Radio's
# buffers, so round-trip times reach seconds when several flows share a CPU-bound PHY: the first
# window goes out before any RTT sample, so a short initial RTO fires for most of it and the
# spurious copies slow everything further (4 nodes, 6 simultaneous 250 kB transfers: 2000+
# retransmissions with initial RTO 1 s; about 100 and 5 s with 3 s). Losses are repaired by the
# ACK bitmaps' fast retransmit, not by timeouts, so the long timers cost little. A window of 64
# frames keeps the PHY busy while a lost frame waits for its fast retransmit (5 % loss: 0.87 x
# the stock rate vs 0.77 x with 32). Measured with benchmarks/link_bench.py; docs/link.md §9.
# min_rto 0.25 (was 0.6) since the RTO estimator samples only the newest acknowledged fragment
# and timeouts retransmit at most rto_probe fragments: at 40 % loss the median LeNet transfer
# took 1.4 s instead of 2.4 s with as many retransmissions (benchmarks/link_bench.py --tails).
OFDM_ARQ_DEFAULTS: dict[str, Any] = {"window": 64, "initial_rto": 3.0, "min_rto": 0.25}


def _arq_block(node_id: int, phy: PhyConfig, arq_opts: Mapping[str, Any]) -> link_arq:
    opts = {**OFDM_ARQ_DEFAULTS, **dict(arq_opts)}
    return link_arq(node_id, mtu=phy.mtu, queue_delivered=True, **opts)


@dataclass
class _RxChain:
    src: int
    dst: int
    rx: ofdm_link_rx
    drop: frame_drop | None
    channel: Any = None

    def counters(self) -> dict[str, int]:
        out = {
            "frames_ok": self.rx.frames_ok(),
            "crc_errors": self.rx.crc_errors(),
            "malformed": self.rx.malformed(),
            "headers_rejected": self.rx.headers_rejected(),
        }
        if self.drop is not None:
            out["dropped"] = self.drop.dropped
        return out


def _attach_rx(
    tb: gr.top_block,
    source: Any,
    arq: link_arq,
    phy: PhyConfig,
    ch: ChannelConfig | None,
    power: float,
    src: int,
    seed: int,
    blocking_demux: bool | None = None,
) -> _RxChain:
    # whole frames: no re-encoding in Python
    rx = phy.rx(arq.node_id, raw_frames=True, blocking_demux=blocking_demux)
    chain = _RxChain(src, arq.node_id, rx, None)
    if ch is not None:
        chain.channel = _channel_block(ch, power, seed)
        tb.connect(source, chain.channel, rx)
    else:
        tb.connect(source, rx)
    if ch is not None and ch.drop_rate > 0:
        chain.drop = frame_drop(ch.drop_rate, seed=seed)
        tb.msg_connect(rx, "out", chain.drop, "in")
        tb.msg_connect(chain.drop, "out", arq, "frames_in")
    else:
        tb.msg_connect(rx, "out", arq, "frames_in")
    return chain


class OfdmLoopbackNetwork:
    """Several nodes in one flowgraph, connected pairwise through simulated channels."""

    def __init__(
        self,
        nodes: Iterable[int] = (0, 1),
        topology: str = "star",
        hub: int = 0,
        phy: PhyConfig | None = None,
        channel: ChannelConfig | None = None,
        channels_by_pair: Mapping[tuple[int, int], ChannelConfig] | None = None,
        **arq_opts: Any,
    ) -> None:
        self.nodes = sorted(set(int(n) for n in nodes))
        if len(self.nodes) < 2:
            raise ValueError("a network needs at least two nodes")
        if topology not in ("star", "mesh"):
            raise ValueError(f"topology must be 'star' or 'mesh', got {topology!r}")
        if topology == "star" and hub not in self.nodes:
            raise ValueError(f"hub {hub} is not one of the nodes {self.nodes}")
        self.phy = phy or PhyConfig()
        self.channel = channel or ChannelConfig()
        self.topology = topology
        self.hub = hub
        self.tb = gr.top_block(f"ofdm_loopback_{'_'.join(map(str, self.nodes))}")
        power = burst_power(self.phy)
        self.arq: dict[int, link_arq] = {}
        self.tx: dict[int, ofdm_link_tx] = {}
        for n in self.nodes:
            self.arq[n] = _arq_block(n, self.phy, arq_opts)
            self.tx[n] = self.phy.tx(n)
            self.tb.msg_connect(self.arq[n], "frames_out", self.tx[n], "in")
        self.rx_chains: list[_RxChain] = []
        for i, (a, b) in enumerate(self.pairs()):
            ch = (channels_by_pair or {}).get((a, b), self.channel)
            seed = ch.seed * 1000 + i + 1
            self.rx_chains.append(
                _attach_rx(self.tb, self.tx[a], self.arq[b], self.phy, ch, power, a, seed)
            )
            if self.phy.mcs is not None:  # coded PHY: b's reports steer a's MCS towards b
                self.tb.msg_connect(self.rx_chains[-1].rx, "report", self.tx[a], "feedback")
        self._links: dict[int, OfdmLoopbackLink] = {}
        self._open: set[int] = set()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False

    def pairs(self) -> list[tuple[int, int]]:
        """Directed (transmitter, receiver) pairs that have a channel."""
        if self.topology == "mesh":
            return [(a, b) for a in self.nodes for b in self.nodes if a != b]
        others = [n for n in self.nodes if n != self.hub]
        return [(self.hub, n) for n in others] + [(n, self.hub) for n in others]

    def start(self) -> None:
        """Start the flowgraph (link() does it on first use)."""
        with self._lock:
            if not self._running and not self._closed:
                self.tb.start()
                self._running = True

    def link(self, node_id: int) -> OfdmLoopbackLink:
        """The Link of ``node_id`` (one per node; starts the flowgraph)."""
        if node_id not in self.arq:
            raise ValueError(f"node {node_id} is not in this network ({self.nodes})")
        with self._lock:
            if self._closed:
                raise RuntimeError("network is closed")
            lk = self._links.get(node_id)
            if lk is None:
                lk = OfdmLoopbackLink(self, node_id)
                self._links[node_id] = lk
                self._open.add(node_id)
        self.start()
        return lk

    def _release(self, node_id: int) -> None:
        with self._lock:
            self._open.discard(node_id)
            last = not self._open
        if last:
            self.close()

    def counters(self) -> dict[str, dict[str, int]]:
        """Receiver counters per directed pair, keyed "src->dst"."""
        return {f"{c.src}->{c.dst}": c.counters() for c in self.rx_chains}

    def close(self) -> None:
        """Close every node and stop the flowgraph."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = self._running
        for arq in self.arq.values():
            arq.link.close()
        if running:
            self.tb.stop()
            self.tb.wait()
        with _NET_LOCK:
            for name, net in list(_NETWORKS.items()):
                if net is self:
                    del _NETWORKS[name]

    def __enter__(self) -> OfdmLoopbackNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OfdmLoopbackLink(GrLink):
    """A node of an OfdmLoopbackNetwork (all nodes in one process and one flowgraph)."""

    def __init__(self, network: OfdmLoopbackNetwork, node_id: int) -> None:
        super().__init__(network.arq[node_id], on_close=lambda: network._release(node_id))
        self.network = network


def _parse_peers(peers: Mapping[int, str] | Iterable[int | str] | None) -> dict[int, str]:
    """{peer id: host}: from a mapping, ids (localhost) or "id@host" strings."""
    if peers is None:
        return {}
    if isinstance(peers, Mapping):
        return {int(k): str(v) for k, v in peers.items()}
    out: dict[int, str] = {}
    for p in peers:
        if isinstance(p, str) and "@" in p:
            nid, host = p.split("@", 1)
            out[int(nid)] = host
        else:
            out[int(p)] = "127.0.0.1"
    return out


class ZmqOfdmLink(GrLink):
    """One node per process; complex samples travel between processes over ZeroMQ PUB/SUB.

    Ideal FDMA: every directed pair has its own private channel, so bursts never collide (the
    shared frequency is ``"ofdm-shared"``, scaleflu.radio.medium). ``bind`` is 127.0.0.1 by
    default; give ``bind="*"`` (or an interface address) for peers on other hosts.

    Binds PUB ``tcp://{bind}:{base_port + node_id}`` for its own transmitter; for each peer,
    connects SUB ``tcp://{host}:{base_port + peer}`` -> channel model -> receiver. Every
    process applies the channel to what it receives, so each direction can be impaired
    differently (``channel`` is this node's receive channel).
    """

    def __init__(
        self,
        node_id: int,
        peers: Mapping[int, str] | Iterable[int | str],
        base_port: int = DEFAULT_ZMQ_BASE_PORT,
        bind: str = "127.0.0.1",  # local simulations; "*" or an interface address across hosts
        phy: PhyConfig | None = None,
        channel: ChannelConfig | None = None,
        hwm: int = -1,
        **arq_opts: Any,
    ) -> None:
        self.phy = phy or PhyConfig()
        self.channel_config = channel or ChannelConfig(snr_db=None)
        self.peers = _parse_peers(peers)
        self.peers.pop(node_id, None)
        if not self.peers:
            raise ValueError("ZmqOfdmLink needs at least one peer")
        remote = sorted(h for h in self.peers.values() if h not in ("127.0.0.1", "localhost"))
        if bind in ("127.0.0.1", "localhost") and remote:
            logger.warning(
                "node %d binds %s only: peers on %s cannot reach it; give bind='*' or an "
                "interface address",
                node_id,
                bind,
                ", ".join(remote),
            )
        self.tb = gr.top_block(f"zmq_ofdm_node_{node_id}")
        power = burst_power(self.phy)
        arq = _arq_block(node_id, self.phy, arq_opts)
        self.tx = self.phy.tx(node_id)
        self.address = f"tcp://{bind}:{base_port + node_id}"
        self.pub = zeromq.pub_sink(gr.sizeof_gr_complex, 1, self.address, 100, False, hwm)
        self.tb.msg_connect(arq, "frames_out", self.tx, "in")
        self.tb.connect(self.tx, self.pub)
        self.rx_chains: list[_RxChain] = []
        self.subs: dict[int, Any] = {}
        for i, (peer, host) in enumerate(sorted(self.peers.items())):
            addr = f"tcp://{host}:{base_port + peer}"
            sub = zeromq.sub_source(gr.sizeof_gr_complex, 1, addr, 100, False, hwm)
            self.subs[peer] = sub
            seed = self.channel_config.seed * 1000 + node_id * 100 + i + 1
            self.rx_chains.append(
                _attach_rx(self.tb, sub, arq, self.phy, self.channel_config, power, peer, seed)
            )
        super().__init__(arq, on_close=self._stop)
        self.tb.start()

    def counters(self) -> dict[str, dict[str, int]]:
        """Receiver counters per peer, keyed "src->dst"."""
        return {f"{c.src}->{c.dst}": c.counters() for c in self.rx_chains}

    def _stop(self) -> None:
        self.tb.stop()
        self.tb.wait()


class UhdLink(GrLink):
    """One node on a real radio: ofdm_link_tx -> USRP sink, USRP source -> ofdm_link_rx.

    ``tx_args`` and ``rx_args`` name the transmitting and receiving devices (they may be the
    same device, e.g. one B200 at a robot; at the edge server a B200 transmits and the
    receive-only X310/TwinRX receives). Frames are paced to the on-air rate: the ARQ's token
    bucket runs at ``pacing`` x the PHY's back-to-back rate at ``samp_rate``.
    """

    def __init__(
        self,
        node_id: int,
        tx_args: str = "type=b200,master_clock_rate=20e6",
        rx_args: str | None = None,
        freq: float = 2.45e9,
        tx_freq: float | None = None,
        rx_freq: float | None = None,
        samp_rate: float = 5e6,
        tx_gain: float = 60.0,
        rx_gain: float = 30.0,
        tx_antenna: str = "TX/RX",
        rx_antenna: str = "RX2",
        tx_subdev: str = "",
        rx_subdev: str = "",
        clock_source: str = "",
        time_source: str = "",
        lo_offset: float = 0.0,
        tx_rms: float = 0.2,
        pacing: float = 0.9,
        phy: PhyConfig | None = None,
        **arq_opts: Any,
    ) -> None:
        from .uhd import usrp_rx, usrp_tx

        self.phy = phy or PhyConfig()
        rx_args = tx_args if rx_args is None else rx_args
        self.tb = gr.top_block(f"uhd_ofdm_node_{node_id}")
        # Open the radios first: a missing device fails here, before any thread starts.
        self.sink = usrp_tx(
            tx_args,
            samp_rate,
            tx_freq or freq,
            tx_gain,
            tx_antenna,
            tx_subdev,
            clock_source,
            time_source,
            lo_offset,
        )
        self.source = usrp_rx(
            rx_args,
            samp_rate,
            rx_freq or freq,
            rx_gain,
            rx_antenna,
            rx_subdev,
            clock_source,
            time_source,
            lo_offset,
        )
        opts = dict(arq_opts)
        opts.setdefault("rate_bytes_per_s", pacing * phy_rate_bytes_per_s(self.phy, samp_rate))
        arq = _arq_block(node_id, self.phy, opts)
        amplitude = tx_rms / math.sqrt(burst_power(self.phy))
        self.tx = self.phy.tx(node_id, amplitude=amplitude)
        self.tb.msg_connect(arq, "frames_out", self.tx, "in")
        self.tb.connect(self.tx, self.sink)
        self.rx_chains = [
            # a radio hears noise between bursts: gr-digital's demux (docs/link.md 8.3 item 5)
            _attach_rx(
                self.tb,
                self.source,
                arq,
                self.phy,
                None,
                1.0,
                -1,
                node_id + 1,
                blocking_demux=False,
            )
        ]
        super().__init__(arq, on_close=self._stop)
        self.tb.start()

    def _stop(self) -> None:
        self.tb.stop()
        self.tb.wait()


# -- factory -------------------------------------------------------------------------------
_NETWORKS: dict[str, Any] = {}
_NET_LOCK = threading.Lock()

_PHY_KEYS = {f.name for f in fields(PhyConfig)}
_CHANNEL_KEYS = {f.name for f in fields(ChannelConfig)}


def _split(opts: dict[str, Any]) -> tuple[PhyConfig, ChannelConfig | None, dict[str, Any]]:
    phy = opts.pop("phy", None) or PhyConfig(
        **{k: opts.pop(k) for k in list(opts) if k in _PHY_KEYS}
    )
    ch_kw = {k: opts.pop(k) for k in list(opts) if k in _CHANNEL_KEYS}
    if "taps" in ch_kw:
        ch_kw["taps"] = tuple(complex(t) for t in ch_kw["taps"])
    channel = opts.pop("channel", None) or (ChannelConfig(**ch_kw) if ch_kw else None)
    return phy, channel, opts


def make_link(kind: str, node_id: int, **opts: Any) -> Link:
    """Build the Link of ``node_id`` for back-end ``kind``.

    kinds and their options (every kind also takes ARQ options: window, rate_bytes_per_s,
    initial_rto, deadline, ... as in scaleflu.link.ArqConfig):

    * ``"memory"``: pure-Python MemoryChannel; ``network`` (name, default "default"),
      ``loss``, ``ber``, ``duplicate``, ``reorder``, ``delay``, ``jitter``, ``seed``,
      ``medium_rate_bytes_per_s`` (ChannelModel.rate_bytes_per_s).
    * ``"ofdm_loopback"`` (alias ``"loopback"``): in-process OFDM flowgraph; ``network`` (name),
      ``nodes`` (all node ids, needed by the first call of a network), ``topology``
      ("star"/"mesh"), ``hub``; channel ``snr_db``, ``cfo``, ``taps``, ``epsilon``,
      ``drop_rate``, ``seed``; PHY ``fft_len``, ``cp_len``, ``bps_header``, ``bps_payload``,
      ``scramble_bits``, ``mtu``, ``post_padding``, ``min_output_buffer``.
    * ``"zmq"``: one process per node; ``peers`` ({id: host}, [ids] or ["id@host"]),
      ``base_port`` (52000), ``bind`` ("127.0.0.1"), ``hwm``; channel and PHY options as above
      (channel off unless given).
    * ``"ofdm-shared"`` (alias ``"shared"``): a node on the shared medium of a running
      scaleflu.radio.medium.MediumBroker; ``broker`` (its address, default
      ``tcp://127.0.0.1:53100``), ``timeout`` (wall seconds to wait for the broker); PHY
      options. The channel is set at the broker (MediumConfig), not here.
    * ``"uhd"``: ``tx_args``, ``rx_args``, ``freq``, ``tx_freq``, ``rx_freq``, ``samp_rate``,
      ``tx_gain``, ``rx_gain``, ``tx_antenna``, ``rx_antenna``, ``tx_subdev``, ``rx_subdev``,
      ``clock_source``, ``time_source``, ``lo_offset``, ``tx_rms``, ``pacing``; PHY options. Raises
      scaleflu.radio.uhd.RadioNotFound when a device does not answer.
    """
    opts = dict(opts)
    kind = kind.lower()
    if kind == "memory":
        name = opts.pop("network", "default")
        model_kw = {k: opts.pop(k) for k in list(opts) if k in _MEMORY_KEYS}
        if "medium_rate_bytes_per_s" in opts:
            model_kw["rate_bytes_per_s"] = opts.pop("medium_rate_bytes_per_s")
        with _NET_LOCK:
            ch = _NETWORKS.get(("memory", name))
            if ch is None:
                ch = MemoryChannel(**model_kw)
                _NETWORKS[("memory", name)] = ch
        return ch.attach(node_id, **opts)
    if kind in ("ofdm_loopback", "loopback"):
        name = opts.pop("network", "default")
        nodes = opts.pop("nodes", None)
        topology = opts.pop("topology", "star")
        hub = opts.pop("hub", 0)
        by_pair = opts.pop("channels_by_pair", None)
        phy, channel, arq_opts = _split(opts)
        with _NET_LOCK:
            net = _NETWORKS.get(("ofdm", name))
            if net is None:
                if nodes is None:
                    raise ValueError("the first make_link of an OFDM loopback network needs nodes")
                net = OfdmLoopbackNetwork(nodes, topology, hub, phy, channel, by_pair, **arq_opts)
                _NETWORKS[("ofdm", name)] = net
        return net.link(node_id)
    if kind == "zmq":
        peers = opts.pop("peers", None)
        base_port = opts.pop("base_port", DEFAULT_ZMQ_BASE_PORT)
        bind = opts.pop("bind", "127.0.0.1")
        hwm = opts.pop("hwm", -1)
        phy, channel, arq_opts = _split(opts)
        return ZmqOfdmLink(node_id, peers or {}, base_port, bind, phy, channel, hwm, **arq_opts)
    if kind in ("ofdm-shared", "shared"):
        from .medium import DEFAULT_MEDIUM_ADDRESS, SharedMediumLink

        broker = opts.pop("broker", DEFAULT_MEDIUM_ADDRESS)
        phy, channel, rest = _split(opts)
        if channel is not None:
            raise ValueError(
                "channel options (snr_db, cfo, ...) of the shared medium are set at its broker"
            )
        return SharedMediumLink(node_id, broker, phy=phy, **rest)
    if kind == "uhd":
        phy, channel, rest = _split(opts)
        if channel is not None:
            raise ValueError("channel options (snr_db, cfo, ...) do not apply to a real radio")
        return UhdLink(node_id, phy=phy, **rest)
    raise ValueError(f"unknown link kind {kind!r} (memory, ofdm_loopback, zmq, ofdm-shared, uhd)")


_MEMORY_KEYS = {
    "loss",
    "ber",
    "duplicate",
    "reorder",
    "reorder_delay",
    "delay",
    "jitter",
    "seed",
}


def close_networks() -> None:
    """Close every network make_link created in this process (tests, app shutdown)."""
    with _NET_LOCK:
        nets = list(_NETWORKS.values())
        _NETWORKS.clear()
    for net in nets:
        net.close()
