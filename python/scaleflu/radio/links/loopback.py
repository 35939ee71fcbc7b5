"""OfdmLoopbackNetwork: every node in one flowgraph of one process (link kind ``ofdm-loopback``).

Each directed pair of nodes that talk has its own channels.channel_model (AWGN at ``snr_db``,
``cfo``, multipath ``taps``) and its own receiver, so there are no collisions (ideal FDMA).
``topology="star"`` connects the hub (server, node 0) with every other node; ``"mesh"``
connects all pairs. The network closes when its last node's link closes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from gnuradio import gr

from ..message_blocks import link_arq
from ..ofdm import ofdm_link_tx
from ..phy import ChannelConfig, PhyConfig, burst_power
from .base import GrLink, _arq_block, _attach_rx, _RxChain


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
            if self.phy.adaptive:  # the MCS towards each peer follows that peer's ACKs
                self.tb.msg_connect(self.arq[n], "mcs_feedback", self.tx[n], "feedback")
        self.rx_chains: list[_RxChain] = []
        for i, (a, b) in enumerate(self.pairs()):
            ch = (channels_by_pair or {}).get((a, b), self.channel)
            seed = ch.seed * 1000 + i + 1
            self.rx_chains.append(
                _attach_rx(self.tb, self.tx[a], self.arq[b], self.phy, ch, power, a, seed)
            )

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

    @property
    def closed(self) -> bool:
        """Whether the network has been closed (it closes with its last node's link)."""
        return self._closed

    def __enter__(self) -> OfdmLoopbackNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OfdmLoopbackLink(GrLink):
    """A node of an OfdmLoopbackNetwork (all nodes in one process and one flowgraph)."""

    def __init__(self, network: OfdmLoopbackNetwork, node_id: int) -> None:
        super().__init__(network.arq[node_id], on_close=lambda: network._release(node_id))
        self.network = network
