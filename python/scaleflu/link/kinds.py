"""The one vocabulary of link kinds, and ``open_link`` to build any of them.

Apps, the config (``testbed.link``), the launcher and the docs use these names only:

================  =========================================================================
``memory``        in one process: MemoryLinks on a MemoryChannel (seeded impairments)
``frames``        link frames through a FrameHub (ZeroMQ broker), no PHY; ideal medium:
                  frames are serialised at the PHY rate and never collide
``frames-shared`` one frequency at frame level: FrameHub in shared mode (overlapping frames
                  collide) and the server-scheduled MAC (scaleflu.link.mac) at every node
``ofdm-loopback`` GNU Radio OFDM PHY, all nodes in one process
``ofdm-pairs``    GNU Radio OFDM PHY over ZeroMQ, a private full-duplex channel per pair of
                  nodes (ideal FDMA: no collisions); formerly ``ofdm-zmq``
``ofdm-shared``   GNU Radio OFDM PHY, every node on one frequency through the sample-level
                  shared medium (scaleflu.radio.medium) with the MAC
``uhd``           real radios (USRP), one frequency, with the MAC
================  =========================================================================

Old spellings (``ofdm-zmq``, ``zmq``, ``ofdm_loopback``, ``loopback``) are accepted with a
DeprecationWarning. The GNU Radio back-ends are imported only when asked for, so this module
and ``scaleflu.link`` stay free of GNU Radio.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from .memory import MemoryChannel

MAC_ARQ_DEFAULTS: dict[str, Any] = {"window": 64, "initial_rto": 5.0, "min_rto": 1.0}
# The MAC on the sample-level medium (ofdm-shared) runs on the medium's virtual clock: a robot's
# answer to its grant starts after its receiver decoded the grant and its transmitter modulated
# the burst, which costs a few lockstep blocks of virtual time (1.6 ms each at 8192 samples and
# 5 MS/s; the node's receive queue lets it run at most 4 blocks ahead of its receiver), not the
# wall-clock milliseconds of a Python thread waking up (REALTIME_MAC of the frames-shared hub).
SHARED_MAC_DEFAULTS: dict[str, Any] = {"turnaround_s": 0.005, "guard_s": 0.03}

log = logging.getLogger(__name__)

LINK_KINDS: dict[str, str] = {
    "memory": "in-process MemoryChannel (tests)",
    "frames": "frame hub without PHY, ideal (no collisions)",
    "frames-shared": "frame hub on one frequency (collisions) with the scheduled MAC",
    "ofdm-loopback": "OFDM PHY, one process",
    "ofdm-pairs": "OFDM PHY over ZeroMQ, ideal private channel per pair (FDMA)",
    "ofdm-shared": "OFDM PHY on the sample-level shared medium with the MAC",
    "uhd": "USRP radios",
}
DEPRECATED_KINDS: dict[str, str] = {
    "ofdm-zmq": "ofdm-pairs",
    "zmq": "ofdm-pairs",
    "ofdm_loopback": "ofdm-loopback",
    "loopback": "ofdm-loopback",
}
# kinds whose nodes run in separate processes (the testbed apps)
PROCESS_KINDS = ("frames", "frames-shared", "ofdm-pairs", "ofdm-shared", "uhd")
# kinds on one shared frequency: the MAC schedules every transmission
SHARED_KINDS = ("frames-shared", "ofdm-shared", "uhd")
# the radio back-end's own name of each GNU Radio kind (scaleflu.radio.links.make_link)
_RADIO_NAME = {
    "ofdm-loopback": "ofdm_loopback",
    "ofdm-pairs": "zmq",
    "ofdm-shared": "ofdm-shared",
    "uhd": "uhd",
}


class UnknownLinkKindError(ValueError):
    """A link kind that is neither a current nor a deprecated name."""


def canonical_kind(kind: str, warn: bool = True) -> str:
    """The current name of ``kind``; old names warn once per call site, unknown ones raise."""
    if not isinstance(kind, str):
        raise UnknownLinkKindError(f"link kind must be a string, got {type(kind).__name__}")
    k = kind.strip().lower()
    if k in LINK_KINDS:
        return k
    if k in DEPRECATED_KINDS:
        new = DEPRECATED_KINDS[k]
        if warn:
            warnings.warn(
                f"link kind {kind!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=3
            )
        return new
    raise UnknownLinkKindError(f"unknown link kind {kind!r}; choose one of {', '.join(LINK_KINDS)}")


def open_link(kind: str, node_id: int, **opts: Any) -> Any:
    """A :class:`~scaleflu.link.Link` of kind ``kind`` for ``node_id``.

    ``memory``, ``frames`` and ``frames-shared`` are pure Python (``frames*`` need ``hub=``;
    ``frames-shared`` takes ``mac`` (a MacConfig or dict), ``members`` (the server's robots) and
    ``server`` (node id, 0)); the others go to ``scaleflu.radio.links.make_link`` (GNU Radio,
    imported now) with ``opts``. ``ofdm-shared`` (and ``uhd`` when given ``mac``) get the MAC
    under their ArqLink (``scaleflu.link.maclink.attach_mac``), with the same three options.
    ARQ options may be given as ``arq={...}`` or directly.
    """
    k = canonical_kind(kind)
    opts = dict(opts)
    arq = dict(opts.pop("arq", None) or {})
    mac_opts = {key: opts.pop(key) for key in ("mac", "members", "server") if key in opts}
    if k == "memory":
        return _memory_link(node_id, opts, arq)
    if k in ("frames", "frames-shared"):
        from .hub import open_hub_link  # noqa: PLC0415 (pyzmq, lazily)

        return open_hub_link(node_id, shared=k == "frames-shared", arq=arq, **opts, **mac_opts)
    try:
        from scaleflu.radio import links as radio_links  # noqa: PLC0415 (GNU Radio, lazily)
    except ImportError as exc:
        raise RuntimeError(
            f"link {k!r} needs scaleflu.radio (GNU Radio): {exc}; use 'frames' or 'frames-shared'"
        ) from exc
    seed = opts.get("seed")
    if k == "ofdm-shared":  # one frequency: the MAC schedules every transmission
        arq = {**MAC_ARQ_DEFAULTS, **arq}
        seed = opts.pop("seed", None)  # the channel's seed lives at the broker
    elif k == "uhd" and "mac" in mac_opts:
        seed = opts.pop("seed", None)  # the MAC's (radios have no simulated channel)
    link = radio_links.make_link(_RADIO_NAME[k], node_id, **opts, **arq)
    if k == "ofdm-shared" or (k == "uhd" and "mac" in mac_opts):
        _put_mac_under(link, node_id, mac_opts, seed)
    return link


def _put_mac_under(link: Any, node_id: int, mac_opts: dict[str, Any], seed: Any) -> None:
    """Run the MAC under a radio back-end's ArqLink and expose it on the Link the app holds."""
    from .hub import mac_config  # noqa: PLC0415
    from .mac import MacConfig  # noqa: PLC0415
    from .maclink import attach_mac  # noqa: PLC0415

    arq_link = link.arq.link if hasattr(link, "arq") else link
    mac = mac_opts.get("mac")
    if getattr(link, "virtual_clock", False) and not isinstance(mac, MacConfig):
        given = {k: v for k, v in (mac or {}).items() if v is not None}
        mac = {**SHARED_MAC_DEFAULTS, **given}  # virtual-time margins (ofdm-shared)
    m = attach_mac(
        arq_link,
        mac_config(mac),
        server_id=int(mac_opts.get("server", 0)),
        members=tuple(mac_opts.get("members", ())),
        seed=None if seed is None else int(seed),
    )
    link.mac = m
    link.is_server = arq_link.is_server
    link.broadcast = arq_link.broadcast


_MEMORY: dict[str, MemoryChannel] = {}
_MEMORY_LOCK = threading.Lock()
_MEMORY_MODEL_KEYS = ("loss", "ber", "duplicate", "reorder", "reorder_delay", "delay", "jitter")


def _memory_link(node_id: int, opts: dict[str, Any], arq: dict[str, Any]) -> Any:
    name = str(opts.pop("network", "default"))
    seed = int(opts.pop("seed", 0))
    model = {k: opts.pop(k) for k in list(opts) if k in _MEMORY_MODEL_KEYS}
    if "medium_rate_bytes_per_s" in opts:
        model["rate_bytes_per_s"] = opts.pop("medium_rate_bytes_per_s")
    with _MEMORY_LOCK:
        ch = _MEMORY.get(name)
        if ch is None:
            ch = _MEMORY[name] = MemoryChannel(seed=seed, **model)
    return ch.attach(node_id, **opts, **arq)


def close_memory_networks() -> None:
    """Close the MemoryChannels ``open_link("memory", ...)`` created (tests)."""
    with _MEMORY_LOCK:
        chans = list(_MEMORY.values())
        _MEMORY.clear()
    for ch in chans:
        ch.close()
