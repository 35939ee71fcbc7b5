"""The link kinds: one vocabulary and one factory for every Link the project builds.

The apps, the config (``testbed.link``), the testbed launcher, the benchmarks and the docs name
links by these kinds only, and ``open_link(kind, node_id, **opts)`` builds any of them:

=================  ============================================================================
``memory``         in one process: MemoryLinks on a MemoryChannel (seeded impairments)
``frames``         link frames through a FrameHub (ZeroMQ broker), no PHY; ideal medium:
                   frames are serialised at the PHY rate and never collide
``frames-shared``  one frequency at frame level: FrameHub in shared mode (overlapping frames
                   collide) and the server-scheduled MAC at every node
``ofdm-loopback``  GNU Radio OFDM PHY, all nodes in one process (ideal FDMA)
``ofdm-pairs``     GNU Radio OFDM PHY over ZeroMQ, a private full-duplex channel per pair of
                   nodes (ideal FDMA: no collisions)
``ofdm-shared``    GNU Radio OFDM PHY, every node on one frequency through the sample-level
                   shared medium (scaleflu.radio.medium) with the MAC
``uhd``            real radios (USRP), one frequency, with the MAC when given ``mac``
=================  ============================================================================

Each :class:`LinkKind` says whether its nodes share one medium (and the MAC schedules them),
whether each node runs in a process of its own (the testbed apps) or all in one, whether it
needs GNU Radio, and which rows of the one table of defaults (:mod:`scaleflu.link.defaults`)
its ARQ and MAC start from. The MAC is composed into a link when the link is built: the hub
links take it as their own class, the GNU Radio back-ends as a ``mac`` argument.

**Layering.** :mod:`scaleflu.link` (pure Python) and :mod:`scaleflu.radio` (GNU Radio) know
nothing of the kinds: this module sits above both. It imports :mod:`scaleflu.link` when it
loads and a back-end of :mod:`scaleflu.radio.links` only when a kind that needs one is opened, so
``open_link("frames", ...)`` and the apps on a frame hub run where GNU Radio is not installed.
A further kind is one :class:`LinkKind` in ``KINDS`` and its opener here; a further back-end is
a module of :mod:`scaleflu.radio.links` (or of :mod:`scaleflu.link`) that the opener builds.

Old names (``ofdm-zmq``, ``zmq`` for ``ofdm-pairs``; ``ofdm_loopback``, ``loopback`` for
``ofdm-loopback``; ``shared`` for ``ofdm-shared``) are accepted as aliases that warn once each.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scaleflu.link.api import Link
from scaleflu.link.arq import ArqConfig
from scaleflu.link.defaults import ARQ_DEFAULTS, MAC_DEFAULTS, mac_config
from scaleflu.link.hub import FrameHubLink, SharedHubLink
from scaleflu.link.mac import MacConfig
from scaleflu.link.maclink import MacSetup
from scaleflu.link.memory import MemoryChannel

__all__ = [
    "ALIASES",
    "KINDS",
    "LinkKind",
    "UnknownLinkKindError",
    "app_kinds",
    "canonical_kind",
    "close_links",
    "link_kind",
    "open_link",
]


class UnknownLinkKindError(ValueError):
    """A link kind that is neither a current name nor an alias."""


@dataclass(frozen=True)
class LinkKind:
    """One kind of link: what it is and how it is built (see the module docstring)."""

    name: str
    summary: str
    opener: Callable[[int, dict[str, Any], dict[str, Any]], Link]  # (node, options, ARQ options)
    shared_medium: bool  # one frequency: transmissions that overlap collide; the MAC schedules
    process_per_node: bool  # each node in a process of its own (the testbed apps); else one
    gnuradio: bool  # needs scaleflu.radio (GNU Radio)
    arq_defaults: Mapping[str, Any]  # a row of scaleflu.link.defaults.ARQ_DEFAULTS (or none)
    mac_defaults: Mapping[str, Any] | None  # the MAC's row of MAC_DEFAULTS; None: no MAC

    def open(self, node_id: int, **opts: Any) -> Link:
        """The Link of ``node_id``; ARQ options as ``arq={...}`` or among ``opts``."""
        opts = dict(opts)
        arq = {**self.arq_defaults, **dict(opts.pop("arq", None) or {})}
        if self.mac_defaults is None:
            extra = sorted(k for k in ("mac", "members", "server") if k in opts)
            if extra:
                raise ValueError(f"link kind {self.name!r} runs no MAC: {', '.join(extra)}")
        return self.opener(int(node_id), opts, arq)


# -- the openers: (node_id, options, ARQ options) -> Link -----------------------------------
_NETWORKS: dict[tuple[str, str], Any] = {}  # in-process networks by (kind, name)
_NET_LOCK = threading.Lock()
_MEMORY_MODEL_KEYS = ("loss", "ber", "duplicate", "reorder", "reorder_delay", "delay", "jitter")


def _open_memory(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``network`` (name, "default"), ``seed``, the ChannelModel's ``loss``, ``ber``,
    ``duplicate``, ``reorder``, ``reorder_delay``, ``delay``, ``jitter`` and
    ``medium_rate_bytes_per_s`` (its ``rate_bytes_per_s``): they shape the network when its
    first node opens it."""
    name = str(opts.pop("network", "default"))
    seed = int(opts.pop("seed", 0))
    model = {k: opts.pop(k) for k in list(opts) if k in _MEMORY_MODEL_KEYS}
    if "medium_rate_bytes_per_s" in opts:
        model["rate_bytes_per_s"] = opts.pop("medium_rate_bytes_per_s")
    with _NET_LOCK:
        ch = _NETWORKS.get(("memory", name))
        if ch is None:
            ch = _NETWORKS[("memory", name)] = MemoryChannel(seed=seed, **model)
    return ch.attach(node_id, **{**arq, **opts})


def _open_hub(
    node_id: int,
    arq: dict[str, Any],
    shared: bool,
    hub: str | None = None,
    mac: Mapping[str, Any] | MacConfig | None = None,
    server: int = 0,
    members: tuple[int, ...] = (),
    rate_bytes_per_s: float | None = None,
    seed: int | None = None,
) -> Link:
    if not hub:
        raise ValueError("a frames link needs hub='tcp://host:port'")
    if not shared:
        return FrameHubLink(node_id, hub, config=ArqConfig(**arq))
    return SharedHubLink(
        node_id,
        hub,
        config=ArqConfig(**arq),
        mac=mac_config(mac, rate_bytes_per_s),
        server_id=server,
        members=tuple(members),
        seed=seed,
    )


def _open_frames(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``hub`` (the FrameHub's address, required)."""
    return _open_hub(node_id, arq, False, **opts)


def _open_frames_shared(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``hub`` (required), ``mac`` (MacConfig or its fields over the realtime defaults),
    ``members`` (the server's robots), ``server`` (node id, 0), ``rate_bytes_per_s`` (the
    MAC's PHY rate unless ``mac`` sets it), ``seed`` (the MAC's)."""
    return _open_hub(node_id, arq, True, **opts)


def _mac_setup(opts: dict[str, Any], clock: str, phy: Any = None) -> MacSetup:
    """The MAC of a GNU Radio back-end from ``mac``, ``server``, ``members`` and ``seed``;
    with the coded PHY ``phy`` the MAC adapts (or fixes) the MCS as the PHY's ``mcs`` says,
    unless ``mac`` sets its own ``mcs``."""
    seed = opts.pop("seed", None)
    mac = opts.pop("mac", None)
    if phy is not None and not isinstance(mac, MacConfig):
        mac = dict(mac or {})
        if mac.get("mcs") is None:
            mac["mcs"] = phy.mcs  # None: the stock PHY, one rate
    return MacSetup(
        mac_config(mac, clock=clock),
        server_id=int(opts.pop("server", 0)),
        members=tuple(opts.pop("members", ())),
        seed=None if seed is None else int(seed),
    )


DEFAULT_MCS = "adaptive"  # the PHY of the link kinds with one: coded, MCS chosen per link


def _phy_options(opts: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """PhyConfig, ChannelConfig and the rest of a radio kind's options: the coded PHY with
    link adaptation unless ``mcs`` says otherwise (``"stock"``/``"none"``/None: the paper's
    uncoded stock PHY; an MCS name: that MCS)."""
    from scaleflu.radio.phy import split_phy_options  # noqa: PLC0415 (GNU Radio)

    if "phy" not in opts:
        opts.setdefault("mcs", DEFAULT_MCS)
    return split_phy_options(opts)


def _radio_links() -> Any:
    try:
        from scaleflu.radio import links  # noqa: PLC0415 (GNU Radio, when a radio kind is opened)
    except ImportError as exc:
        raise RuntimeError(
            f"this link kind needs scaleflu.radio (GNU Radio): {exc}; "
            "use 'frames' or 'frames-shared'"
        ) from exc
    return links


def _open_ofdm_loopback(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``network`` (name; its first node needs ``nodes``, every node id), ``topology``
    ("star"/"mesh"), ``hub`` (0), ``channels_by_pair``; channel options (``snr_db``, ``cfo``,
    ``taps``, ``epsilon``, ``drop_rate``, ``seed``) and PHY options (``mcs``: "adaptive" by
    default, "stock" for the paper's uncoded PHY, or an MCS name; ``fft_len``, ``cp_len``,
    ``bps_header``, ``bps_payload``, ``scramble_bits``, ``mtu``, ``post_padding``,
    ``min_output_buffer``). The network closes with its last node's link."""
    radio = _radio_links()

    name = str(opts.pop("network", "default"))
    nodes = opts.pop("nodes", None)
    topology = opts.pop("topology", "star")
    hub = opts.pop("hub", 0)
    by_pair = opts.pop("channels_by_pair", None)
    phy, channel, rest = _phy_options(opts)
    with _NET_LOCK:
        net = _NETWORKS.get(("ofdm-loopback", name))
        if net is None or net.closed:
            if nodes is None:
                raise ValueError("the first node of an ofdm-loopback network needs nodes=(...)")
            net = radio.OfdmLoopbackNetwork(
                nodes, topology, hub, phy, channel, by_pair, **{**arq, **rest}
            )
            _NETWORKS[("ofdm-loopback", name)] = net
    return net.link(node_id)


def _open_ofdm_pairs(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``peers`` ({id: host}, [ids] or ["id@host"]), ``base_port`` (52000), ``bind``
    ("127.0.0.1"; "*" for peers on other hosts), ``hwm``; channel options (off unless given)
    and PHY options as for ``ofdm-loopback``."""
    radio = _radio_links()
    from scaleflu.radio.links.pairs import DEFAULT_ZMQ_BASE_PORT  # noqa: PLC0415 (GNU Radio)

    peers = opts.pop("peers", None)
    base_port = opts.pop("base_port", DEFAULT_ZMQ_BASE_PORT)
    bind = opts.pop("bind", "127.0.0.1")
    hwm = opts.pop("hwm", -1)
    phy, channel, rest = _phy_options(opts)
    return radio.ZmqOfdmLink(
        node_id, peers or {}, base_port, bind, phy, channel, hwm, **{**arq, **rest}
    )


def _open_ofdm_shared(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``broker`` (the medium broker's address, tcp://127.0.0.1:53100), ``timeout`` (wall
    seconds to wait for it), ``virtual_clock`` (True), ``rx_lag``; the MAC's ``mac``,
    ``members``, ``server``, ``seed``; PHY options (``mcs`` as for ``ofdm-loopback``: the MAC
    then chooses each robot's MCS). The channel is the broker's (MediumConfig), not an option
    here."""
    radio = _radio_links()
    from scaleflu.radio.medium import DEFAULT_MEDIUM_ADDRESS  # noqa: PLC0415 (GNU Radio side)

    virtual = opts.get("virtual_clock", True)
    broker = opts.pop("broker", DEFAULT_MEDIUM_ADDRESS)
    mac_opts = {k: opts.pop(k) for k in ("mac", "server", "members", "seed") if k in opts}
    phy, channel, rest = _phy_options(opts)
    mac = _mac_setup(mac_opts, "virtual" if virtual else "realtime", phy)
    if channel is not None:
        raise ValueError(
            "channel options (snr_db, cfo, ...) of the shared medium are set at its broker"
        )
    return radio.SharedMediumLink(node_id, broker, phy=phy, mac=mac, **{**arq, **rest})


def _open_uhd(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Link:
    """``tx_args``, ``rx_args``, ``freq``, ``tx_freq``, ``rx_freq``, ``samp_rate``, ``tx_gain``,
    ``rx_gain``, ``tx_antenna``, ``rx_antenna``, ``tx_subdev``, ``rx_subdev``, ``clock_source``,
    ``time_source``, ``lo_offset``, ``tx_rms``, ``pacing``; PHY options; the MAC's ``mac``,
    ``members``, ``server``, ``seed`` (no MAC without ``mac``). A device that does not answer
    raises scaleflu.radio.uhd.RadioNotFound."""
    radio = _radio_links()

    mac_opts = {k: opts.pop(k) for k in ("mac", "server", "members", "seed") if k in opts}
    phy, channel, rest = _phy_options(opts)
    if "samp_rate" in rest and isinstance(mac_opts.get("mac"), Mapping):
        mac_opts["mac"] = {"samp_rate": float(rest["samp_rate"]), **mac_opts["mac"]}
    mac = _mac_setup(mac_opts, "realtime", phy) if "mac" in mac_opts else None
    if channel is not None:
        raise ValueError("channel options (snr_db, cfo, ...) do not apply to a real radio")
    return radio.UhdLink(node_id, phy=phy, mac=mac, **{**arq, **rest})


KINDS: dict[str, LinkKind] = {
    k.name: k
    for k in (
        LinkKind(
            "memory", "in-process MemoryChannel (tests)", _open_memory,
            shared_medium=False, process_per_node=False, gnuradio=False,
            arq_defaults={}, mac_defaults=None,
        ),
        LinkKind(
            "frames", "frame hub without PHY, ideal (no collisions)", _open_frames,
            shared_medium=False, process_per_node=True, gnuradio=False,
            arq_defaults=ARQ_DEFAULTS["frames"], mac_defaults=None,
        ),
        LinkKind(
            "frames-shared", "frame hub on one frequency (collisions) with the scheduled MAC",
            _open_frames_shared,
            shared_medium=True, process_per_node=True, gnuradio=False,
            arq_defaults=ARQ_DEFAULTS["mac"], mac_defaults=MAC_DEFAULTS["realtime"],
        ),
        LinkKind(
            "ofdm-loopback", "OFDM PHY, one process", _open_ofdm_loopback,
            shared_medium=False, process_per_node=False, gnuradio=True,
            arq_defaults=ARQ_DEFAULTS["ofdm"], mac_defaults=None,
        ),
        LinkKind(
            "ofdm-pairs", "OFDM PHY over ZeroMQ, ideal private channel per pair (FDMA)",
            _open_ofdm_pairs,
            shared_medium=False, process_per_node=True, gnuradio=True,
            arq_defaults=ARQ_DEFAULTS["ofdm"], mac_defaults=None,
        ),
        LinkKind(
            "ofdm-shared", "OFDM PHY on the sample-level shared medium with the MAC",
            _open_ofdm_shared,
            shared_medium=True, process_per_node=True, gnuradio=True,
            arq_defaults=ARQ_DEFAULTS["mac"],
            mac_defaults={**MAC_DEFAULTS["realtime"], **MAC_DEFAULTS["virtual"]},
        ),
        LinkKind(
            "uhd", "USRP radios, one frequency, with the MAC", _open_uhd,
            shared_medium=True, process_per_node=True, gnuradio=True,
            arq_defaults=ARQ_DEFAULTS["ofdm"], mac_defaults=MAC_DEFAULTS["realtime"],
        ),
    )
}  # fmt: skip

ALIASES: dict[str, str] = {
    "ofdm-zmq": "ofdm-pairs",
    "zmq": "ofdm-pairs",
    "ofdm_loopback": "ofdm-loopback",
    "loopback": "ofdm-loopback",
    "shared": "ofdm-shared",
}
_WARNED: set[str] = set()


def link_kind(kind: str) -> LinkKind:
    """The LinkKind named ``kind``; an alias warns once (FutureWarning), anything else raises."""
    if not isinstance(kind, str):
        raise UnknownLinkKindError(f"link kind must be a string, got {type(kind).__name__}")
    k = kind.strip().lower()
    if k in KINDS:
        return KINDS[k]
    if k in ALIASES:
        new = ALIASES[k]
        if k not in _WARNED:
            _WARNED.add(k)
            warnings.warn(
                f"link kind {kind!r} is an old name; use {new!r}", FutureWarning, stacklevel=3
            )
        return KINDS[new]
    raise UnknownLinkKindError(f"unknown link kind {kind!r}; choose one of {', '.join(KINDS)}")


def canonical_kind(kind: str) -> str:
    """The current name of ``kind`` (see :func:`link_kind`)."""
    return link_kind(kind).name


def app_kinds() -> tuple[str, ...]:
    """Kinds whose nodes run in processes of their own: what the testbed apps can open."""
    return tuple(k.name for k in KINDS.values() if k.process_per_node)


def open_link(kind: str, node_id: int, **opts: Any) -> Link:
    """The :class:`~scaleflu.link.Link` of ``node_id`` for link kind ``kind``.

    Every kind takes ARQ options (``window``, ``rate_bytes_per_s``, ``initial_rto``,
    ``deadline``, ... as in :class:`~scaleflu.link.arq.ArqConfig`), as ``arq={...}`` or among
    ``opts`` (these win), over the kind's row of defaults; the MAC's options on a kind without
    a MAC are an error. The options of each kind are in the docstring of
    its opener in this module (``_open_<kind>``) and in docs/link.md.
    """
    return link_kind(kind).open(node_id, **opts)


def close_links() -> None:
    """Close the in-process networks ``open_link`` made (``memory``, ``ofdm-loopback``)."""
    with _NET_LOCK:
        nets = list(_NETWORKS.values())
        _NETWORKS.clear()
    for net in nets:
        net.close()
