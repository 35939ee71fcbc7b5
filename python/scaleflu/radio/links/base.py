"""GrLink, the base of the GNU Radio links, and the receive chain every back-end attaches.

Every back-end runs the same stack per node::

    send() -> link_arq -> ofdm_link_tx (frame_builder, OFDM, zero padding) -> medium
    medium -> ofdm_link_rx (OFDM, header guard, frame_parser) [-> frame_drop] -> link_arq -> recv()

``GrLink`` is the :class:`scaleflu.link.Link` over the ``link_arq`` block of a running
flowgraph; the back-ends differ only in the medium between the transmitter and the receivers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gnuradio import gr

from scaleflu.link.api import Link, message_bytes
from scaleflu.link.arq import SendHandle
from scaleflu.link.defaults import ARQ_DEFAULTS
from scaleflu.link.maclink import MacSetup, attach_mac
from scaleflu.link.wire import Message

from ..message_blocks import frame_drop, link_arq
from ..ofdm import ofdm_link_rx
from ..phy import ChannelConfig, PhyConfig, _channel_block


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

    def set_require_auth(self, on: bool) -> None:
        """Drop frames from peers without a key (see ArqEndpoint.set_require_auth)."""
        self.arq.link.set_require_auth(on)

    def recv(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """Next delivered (src, payload) or None after ``timeout``."""
        return self.arq.link.recv(timeout)

    def receiving_from(self, peer: int) -> bool:
        """Whether a message from ``peer`` is being reassembled (see Link.receiving_from)."""
        return self.arq.link.receiving_from(peer)

    def stats(self) -> dict[str, Any]:
        """ARQ and reassembly counters of this node."""
        return self.arq.stats()

    def _run_mac(self, mac: MacSetup) -> None:
        """Run the server-scheduled MAC under this node's ARQ (a back-end's constructor calls it
        once its flowgraph runs); the link gains ``mac``, ``is_server`` and ``broadcast``."""
        link = self.arq.link
        self.mac = attach_mac(
            link, mac.config, server_id=mac.server_id, members=mac.members, seed=mac.seed
        )
        self.is_server = link.is_server
        self.broadcast = link.broadcast

    def close(self) -> None:
        """Fail pending sends and release the node (the flowgraph stops with its last node)."""
        if self._closed:
            return
        self._closed = True
        self.arq.link.close()
        if self._on_close is not None:
            self._on_close()


def _arq_block(node_id: int, phy: PhyConfig, arq_opts: Mapping[str, Any]) -> link_arq:
    opts = {**ARQ_DEFAULTS["ofdm"], **dict(arq_opts)}
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
