"""Links for the testbed apps, by the kind names of :mod:`scaleflu.link.kinds`.

``make_testbed_link`` builds any kind through ``scaleflu.link.kinds.open_link``: the radio
back-ends of scaleflu.radio (GNU Radio, imported lazily) or a FrameHub link
(:mod:`scaleflu.link.hub`, no PHY: cheap on small machines; the ARQ, the MAC, fragmentation and
every byte above the PHY are the same as over the radio). ``frames-shared`` puts every node on
one frequency with collisions and runs the server-scheduled MAC.
"""

from __future__ import annotations

import logging
from typing import Any

from scaleflu.link import Link
from scaleflu.link.hub import (  # noqa: F401 (moved to scaleflu.link.hub; names kept here)
    FRAMES_ARQ_DEFAULTS,
    MAC_ARQ_DEFAULTS,
    FrameHub,
    FrameHubLink,
    SharedHubLink,
)
from scaleflu.link.kinds import LINK_KINDS as _KINDS
from scaleflu.link.kinds import PROCESS_KINDS, canonical_kind, open_link

log = logging.getLogger(__name__)

LINK_KINDS = tuple(_KINDS)


def make_testbed_link(kind: str, node_id: int, **opts: Any) -> Link:
    """A Link for node ``node_id`` of kind ``kind`` (scaleflu.link.kinds; old names warn).

    ``frames``/``frames-shared`` use ``hub`` (and ``mac``, ``members``, ``rate_bytes_per_s``
    for the shared one). The radio kinds hand every option that is not None to
    ``scaleflu.radio.links.make_link``: ``ofdm-pairs`` (``peers``, ``base_port``, ``snr_db``,
    ``drop_rate``, ``cfo``, ``seed``), ``uhd`` (``tx_args``, ``rx_args``, ``freq``,
    ``samp_rate``, ``tx_gain``, ``rx_gain``, ``tx_subdev``, ``rx_subdev``, ``clock_source``,
    ``time_source``, ``lo_offset``), ``ofdm-shared``, ``ofdm-loopback`` (one process only). ARQ
    options go in ``arq`` (a dict).
    """
    k = canonical_kind(kind)
    arq = dict(opts.pop("arq", None) or {})
    clean = {key: v for key, v in opts.items() if v is not None}
    if k in ("frames", "frames-shared"):
        if not clean.get("hub"):
            raise ValueError("the frames link needs hub='tcp://host:port'")
        if k == "frames":
            clean = {"hub": clean["hub"]}
        return open_link(k, node_id, arq=arq, **clean)
    if k not in PROCESS_KINDS and k != "ofdm-loopback":
        raise ValueError(f"link {k!r} is not for the testbed apps")
    clean.pop("hub", None)
    for key in ("mac", "members", "rate_bytes_per_s"):
        clean.pop(key, None)
    if k == "uhd" and "time_source" in clean:
        import inspect

        from scaleflu.radio import links as radio_links  # noqa: PLC0415 (GNU Radio, lazily)

        if "time_source" not in inspect.signature(radio_links.UhdLink).parameters:
            log.warning(
                "time source %r ignored: scaleflu.radio.UhdLink has no time_source option",
                clean.pop("time_source"),
            )
    return open_link(k, node_id, arq=arq, **clean)


def link_stats(link: Link) -> dict[str, Any]:
    """ARQ counters of a link when it has them (bytes on air, retransmissions), else {}."""
    stats = getattr(link, "stats", None)
    if callable(stats):
        try:
            return dict(stats())
        except Exception:  # a back-end without counters
            return {}
    return {}
