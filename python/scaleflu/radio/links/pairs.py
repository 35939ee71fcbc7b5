"""ZmqOfdmLink: one node per process, a private channel per pair over ZeroMQ (``ofdm-pairs``).

The node's transmitter's samples go to a ZeroMQ PUB socket that it *binds* on
``tcp://{bind}:{base_port + node_id}``; for each peer it *connects* a SUB socket to
``tcp://{host}:{base_port + peer}`` and runs that peer's samples through a channel model and its
own receiver. Start order does not matter (ZeroMQ reconnects; frames published before a
subscriber joined are lost and the ARQ resends them). Ideal FDMA: no collisions ever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gnuradio import gr, zeromq

from ..phy import ChannelConfig, PhyConfig, burst_power
from .base import GrLink, _arq_block, _attach_rx, _RxChain

logger = logging.getLogger(__name__)

DEFAULT_ZMQ_BASE_PORT = 52000


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
        if self.phy.adaptive:  # the MCS towards each peer follows that peer's ACKs
            self.tb.msg_connect(arq, "mcs_feedback", self.tx, "feedback")
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
