"""make_link(kind, node_id, **opts): the Link of a node for a radio back-end, by kind name."""

from __future__ import annotations

import threading
from typing import Any

from scaleflu.link.api import Link
from scaleflu.link.memory import MemoryChannel

from ..medium.config import DEFAULT_MEDIUM_ADDRESS
from ..phy import split_phy_options as _split
from .loopback import OfdmLoopbackNetwork
from .pairs import DEFAULT_ZMQ_BASE_PORT, ZmqOfdmLink
from .shared import SharedMediumLink
from .usrp import UhdLink

# -- factory -------------------------------------------------------------------------------
_NETWORKS: dict[str, Any] = {}


_NET_LOCK = threading.Lock()


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
            if net is None or net.closed:  # a network closes with its last node
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
